"""Catalog lookups over an ordinary psycopg connection: what decoding and preflight need to know.

pgoutput names a non-built-in type (enum, domain, composite, range) with a Type message
carrying only its namespace and name; to decode its values the decoder needs its kind, the
built-in type a domain finally rests on and an array's element type, which live in pg_type.
``server_facts`` gathers, in one round trip, the settings and counts that decide whether logical
replication can start at all.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcdc.connection.deadline import answered_within
from pgcdc.connection.server_errors import translated
from pgcdc.decoding.pgtypes import BY_OID, TypeInfo
from pgcdc.decoding.values import TypeRegistry
from pgcdc.errors import StaleRowsWarning, recopy_hint
from pgcdc.events import Table, Type
from pgcdc.lsn import LSN

log = logging.getLogger(__name__)

# Domains may rest on domains: follow typbasetype down to the first non-domain, keeping the
# type modifier of the domain nearest the base that has one (only a domain over the base type
# itself can: numeric(10,2)). A type is a true array when it is variable-length and has an
# element type (PostgreSQL's own test, which leaves out fixed-length types with typelem set,
# such as point or name).
_TYPE_INFO = """
WITH RECURSIVE chain (start, current, current_kind, modifier) AS (
    SELECT t.oid, t.oid, t.typtype, -1 FROM pg_type t WHERE t.oid = ANY(%s::oid[])
  UNION ALL
    SELECT chain.start, base.oid, base.typtype,
           CASE WHEN domain.typtypmod <> -1 THEN domain.typtypmod ELSE chain.modifier END
    FROM chain
    JOIN pg_type domain ON domain.oid = chain.current
    JOIN pg_type base ON base.oid = domain.typbasetype
    WHERE chain.current_kind = 'd'
)
SELECT t.oid::bigint, n.nspname::text, t.typname::text, t.typtype::text,
       CASE WHEN t.typtype = 'd' THEN base.oid::bigint ELSE 0 END,
       CASE WHEN t.typtype = 'r'
            THEN (SELECT r.rngsubtype::bigint FROM pg_range r WHERE r.rngtypid = t.oid)
            {multirange}
            WHEN base.typlen = -1 AND base.typelem <> 0 THEN base.typelem::bigint ELSE 0 END,
       chain.modifier
FROM chain
JOIN pg_type base ON base.oid = chain.current
JOIN pg_type t ON t.oid = chain.start
JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE chain.current_kind <> 'd'
"""

_MULTIRANGE_ELEMENT = """WHEN t.typtype = 'm'
            THEN (SELECT r.rngtypid::bigint FROM pg_range r WHERE r.rngmultitypid = t.oid)"""


def type_info(conn: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, TypeInfo]:
    """TypeInfo for each OID found in pg_type; OIDs with no type (dropped since) are absent.

    ``base_oid`` is the final non-domain base of a domain (a domain over a domain over int4
    gives int4); ``element_oid`` is the element type of an array, or of the array a domain
    rests on, or a range type's subtype, or a multirange's range type.
    """
    wanted = sorted({int(oid) for oid in oids})
    if not wanted:
        return {}
    # A multirange's range type: pg_range.rngmultitypid exists from PostgreSQL 14 on.
    multirange = _MULTIRANGE_ELEMENT if conn.info.server_version >= 140000 else ""
    with translated():
        rows = conn.execute(_TYPE_INFO.format(multirange=multirange), (wanted,)).fetchall()
    return {
        oid: TypeInfo(
            oid=oid,
            namespace=namespace,
            name=name,
            kind=kind,
            base_oid=base,
            element_oid=element,
            base_modifier=modifier,
        )
        for oid, namespace, name, kind, base, element, modifier in rows
    }


# The types of composite types' live fields.
_FIELD_TYPES = """
SELECT DISTINCT a.atttypid::bigint
FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
WHERE t.oid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
"""


def type_closure(conn: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, TypeInfo]:
    """``type_info`` of ``oids`` and of every non-built-in type they rest on (a domain's base,
    an array's element, a range's subtype, a composite's fields: an array of domains, a domain
    over an enum), which decoding needs too but pgoutput names no Type message for."""
    found: dict[int, TypeInfo] = {}
    asked: set[int] = {0, *BY_OID}
    wanted = {int(oid) for oid in oids} - asked
    while wanted:
        asked |= wanted
        infos = type_info(conn, wanted)
        found.update(infos)
        wanted = {r for info in infos.values() for r in (info.base_oid, info.element_oid)}
        composites = [oid for oid, info in infos.items() if info.kind == "c"]
        if composites:
            with translated():
                rows = conn.execute(_FIELD_TYPES, (composites,)).fetchall()
            wanted |= {int(row[0]) for row in rows}
        wanted -= asked
    return found


# Per live column: the value rows written before it was added have (attmissingval, a one-element
# array printed by the session: its settings make the text what pgoutput would send), and
# whether it has a default that is not such a value.
_COLUMN_DEFAULTS = """
SELECT a.attname::text,
       CASE WHEN a.atthasmissing THEN a.attmissingval::text END,
       a.atthasdef AND NOT a.atthasmissing
FROM pg_attribute a
WHERE a.attrelid = %s::oid AND a.attnum > 0 AND NOT a.attisdropped
"""
_TEXT_ARRAY = 1009


def column_defaults(
    conn: psycopg.Connection[Any], relation_oid: int
) -> dict[str, tuple[str | None, bool]]:
    """Column name -> (text of its missing value or None, whether it has another default)."""
    with translated():
        rows = conn.execute(_COLUMN_DEFAULTS, (relation_oid,)).fetchall()
    parse = TypeRegistry().codec(_TEXT_ARRAY).text
    result: dict[str, tuple[str | None, bool]] = {}
    for name, missing, unseen in rows:
        value = None if missing is None else parse(missing)[0]
        result[name] = (value, bool(unseen))
    return result


def type_event(info: TypeInfo, lsn: LSN, xid: int | None = None) -> Type:
    """The Type event that carries ``info`` into the change log."""
    return Type(
        lsn,
        info.oid,
        info.namespace,
        info.name,
        xid,
        kind=info.kind,
        base_oid=info.base_oid,
        element_oid=info.element_oid,
        base_modifier=info.base_modifier,
    )


class TypeDescriber:
    """Completes pgoutput's Type messages from pg_type, over an ordinary connection beside the
    replication one (opened at the first Type message, which is rare: once per type and
    session).

    pgoutput names a type but not its kind, base or element; without them readers of the change
    log would type a domain over numeric as a string. A domain's base type and modifier, an
    array's element type and a type's kind cannot change while the type exists, so reading the
    catalog now, not as of the message's LSN, gives the same answer; a type dropped meanwhile
    keeps only its name (its values are then decoded as text) and a warning says so."""

    def __init__(
        self,
        conninfo: str,
        application_name: str = "pgcdc",
        options: str = "",
        timeout: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._application_name = application_name
        self._options = options  # the walsender's session settings: values print alike
        # The replication stream's receive_timeout: a lookup blocks the stream, so it must not
        # wait longer than the stream itself would for a message.
        self._timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._seen: dict[int, Table] = {}  # the last definition of each table this session

    @contextlib.contextmanager
    def _lookup(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """The catalog connection (opened on first use) for one lookup that must be answered
        within the timeout; a connection that failed is closed, so the next lookup reconnects."""
        try:
            if self._conn is None:
                extra: dict[str, Any] = {}
                if self._timeout is not None and "connect_timeout" not in conninfo_to_dict(
                    self._conninfo
                ):
                    extra["connect_timeout"] = max(2, math.ceil(self._timeout))
                with translated():
                    self._conn = psycopg.connect(
                        self._conninfo,
                        autocommit=True,
                        application_name=self._application_name,
                        options=self._options,
                        client_encoding="UTF8",
                        **extra,
                    )
            with answered_within(self._conn, self._timeout, what):
                yield self._conn
        except BaseException:
            self.close()
            raise

    def describe_relation(self, table: Table) -> Table:
        """``table`` with each column's missing value and unseen default (``Column.missing``,
        ``default_unseen``); the same object when there are none. A column added with a
        non-volatile default keeps its value in attmissingval until the table is rewritten,
        so reading it now gives what rows that predate the column hold."""
        self._report_retyped(table)
        with self._lookup(f"the catalog lookup of {table.qualified_name}'s columns") as conn:
            defaults = column_defaults(conn, table.oid)
        columns = tuple(
            replace(column, missing=found[0], default_unseen=found[1])
            if (found := defaults.get(column.name)) is not None
            else column
            for column in table.columns
        )
        if columns == table.columns:
            return table
        return replace(table, columns=columns)

    def _report_retyped(self, table: Table) -> None:
        """Warn when a column changed type since this session's last definition of the table:
        ALTER COLUMN ... TYPE rewrites every row without a logical change, so rows not changed
        since keep their old values downstream. (A change between two sessions goes unseen.)"""
        before = {c.name: c for c in self._seen.get(table.oid, Table("", "", ())).columns}
        self._seen[table.oid] = table
        retyped = [
            c.name
            for c in table.columns
            if c.name in before
            and (before[c.name].type_oid, before[c.name].type_modifier)
            != (c.type_oid, c.type_modifier)
        ]
        if retyped:
            message = (
                f"{table.qualified_name}: column(s) {retyped} changed type (ALTER COLUMN ... "
                "TYPE rewrites the table without logical changes): rows not changed since keep "
                "their values as converted downstream, which may differ from the source's. "
                f"Re-copy the table: {recopy_hint(table.namespace, table.name)}"
            )
            log.warning("%s", message)
            warnings.warn(message, StaleRowsWarning, stacklevel=3)

    def describe(self, event: Type) -> list[Type]:
        """``event`` with its pg_type facts, preceded by Type events for the non-built-in types
        it rests on (pgoutput sends none for an array's element or a domain's base)."""
        with self._lookup(f"the catalog lookup of type {event.name} (OID {event.oid})") as conn:
            infos = type_closure(conn, [event.oid])
        if event.oid not in infos:
            log.warning(
                "type %s.%s (OID %d) is no longer in pg_type: its values are kept as text",
                event.namespace,
                event.name,
                event.oid,
            )
            return [event]
        first = [info for oid, info in infos.items() if oid != event.oid]
        return [type_event(info, event.lsn, event.xid) for info in (*first, infos[event.oid])]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """Settings, capacity and privileges that logical replication depends on."""

    server_version_num: int
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    replication_slots_used: int
    # None when the role may not see other roles' backends (needs superuser or
    # pg_read_all_stats, e.g. via pg_monitor): pg_stat_activity then hides their type.
    wal_senders_used: int | None
    server_encoding: str
    role: str
    role_replication: bool
    role_superuser: bool
    in_recovery: bool

    @property
    def free_replication_slots(self) -> int:
        return max(self.max_replication_slots - self.replication_slots_used, 0)

    @property
    def free_wal_senders(self) -> int | None:
        if self.wal_senders_used is None:
            return None
        return max(self.max_wal_senders - self.wal_senders_used, 0)

    @property
    def can_replicate(self) -> bool:
        """The role may use replication slots and start WAL senders."""
        return self.role_replication or self.role_superuser


_SERVER_FACTS = """
SELECT current_setting('server_version_num')::integer,
       current_setting('wal_level'),
       current_setting('max_replication_slots')::integer,
       current_setting('max_wal_senders')::integer,
       (SELECT count(*) FROM pg_replication_slots)::integer,
       CASE WHEN r.rolsuper OR pg_has_role('pg_read_all_stats', 'USAGE') THEN
           (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::integer
       END,
       current_setting('server_encoding'),
       r.rolname::text,
       r.rolreplication,
       r.rolsuper,
       pg_is_in_recovery()
FROM pg_roles r
WHERE r.rolname = current_user
"""


def server_facts(conn: psycopg.Connection[Any]) -> ServerFacts:
    """Everything preflight checks, readable by any role (only the WAL sender count needs
    pg_read_all_stats)."""
    with translated():
        row = conn.execute(_SERVER_FACTS).fetchone()
    assert row is not None, "current_user always has a pg_roles row"
    return ServerFacts(*row)
