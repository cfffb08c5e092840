"""Catalog lookups over an ordinary psycopg connection: what decoding and preflight need to know.

pgoutput names a non-built-in type (enum, domain, composite, range) with a Type message
carrying only its namespace and name; to decode its values the decoder needs its kind, the
built-in type a domain finally rests on and an array's element type, which live in pg_type.
``server_facts`` gathers, in one round trip, the settings and counts that decide whether logical
replication can start at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from pgcdc.connection.server_errors import translated
from pgcdc.decoding.pgtypes import TypeInfo

# Domains may rest on domains: follow typbasetype down to the first non-domain. A type is a
# true array when it is variable-length and has an element type (PostgreSQL's own test, which
# leaves out fixed-length types with typelem set, such as point or name).
_TYPE_INFO = """
WITH RECURSIVE chain (start, current, current_kind) AS (
    SELECT t.oid, t.oid, t.typtype FROM pg_type t WHERE t.oid = ANY(%s::oid[])
  UNION ALL
    SELECT chain.start, base.oid, base.typtype
    FROM chain
    JOIN pg_type domain ON domain.oid = chain.current
    JOIN pg_type base ON base.oid = domain.typbasetype
    WHERE chain.current_kind = 'd'
)
SELECT t.oid::bigint, n.nspname::text, t.typname::text, t.typtype::text,
       CASE WHEN t.typtype = 'd' THEN base.oid::bigint ELSE 0 END,
       CASE WHEN base.typlen = -1 AND base.typelem <> 0 THEN base.typelem::bigint ELSE 0 END
FROM chain
JOIN pg_type base ON base.oid = chain.current
JOIN pg_type t ON t.oid = chain.start
JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE chain.current_kind <> 'd'
"""


def type_info(conn: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, TypeInfo]:
    """TypeInfo for each OID found in pg_type; OIDs with no type (dropped since) are absent.

    ``base_oid`` is the final non-domain base of a domain (a domain over a domain over int4
    gives int4); ``element_oid`` is the element type of an array, or of the array a domain
    rests on.
    """
    wanted = sorted({int(oid) for oid in oids})
    if not wanted:
        return {}
    with translated():
        rows = conn.execute(_TYPE_INFO, (wanted,)).fetchall()
    return {
        oid: TypeInfo(
            oid=oid, namespace=namespace, name=name, kind=kind, base_oid=base, element_oid=element
        )
        for oid, namespace, name, kind, base, element in rows
    }


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
