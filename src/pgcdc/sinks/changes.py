"""The sinks' input contract: one source table's changes as an Arrow table, and its ``TableSpec``.

A change table has the source table's own columns, typed (``pgcdc.decoding.arrow``), followed by
metadata columns:

==================  =========================  =================================================
column              type                       meaning
==================  =========================  =================================================
``_op``             string                     ``insert``, ``update``, ``delete``, ``truncate``
``_commit_lsn``     uint64                     commit LSN of the transaction
``_seq``            int64                      position of the change in its transaction (an
                                               initial snapshot, one transaction, may hold
                                               more rows than a uint32 counts)
``_lsn``            uint64                     LSN of the change itself
``_xid``            int64, nullable            transaction id, when the plugin sent one
``_commit_time``    timestamp[us, UTC]         commit time of the transaction
``_origin``         string, nullable           replication origin of the transaction
``_unchanged``      list<string>               columns holding an unchanged TOASTed value the
                                               server did not send: their typed value is null,
                                               and it must be read as "same as before"
``_text``           map<string, string>,       PostgreSQL text form of the values the typed
                    nullable, optional         column cannot hold exactly (its typed value is
                                               null; ``pgcdc.decoding.arrow``'s ``_pgcdc_text``)
``_old``            struct<table columns>      old key (UPDATE that changed the key, DELETE), or
                    nullable                   the whole old row (REPLICA IDENTITY FULL)
==================  =========================  =================================================

Table columns hold the new row for INSERT and UPDATE and are null for DELETE and TRUNCATE. Rows
may come in any order: the sinks order them by (``_commit_lsn``, ``_seq``). ``_old`` may carry a
subset of the table's columns (at least the key); a missing field reads as "not sent".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.errors import InvalidChangeBatch
from pgcdc.events import Column, Relation, ReplicaIdentity
from pgcdc.lsn import LSN
from pgcdc.sinks.schema import contiguous

OP = "_op"
COMMIT_LSN = "_commit_lsn"
SEQ = "_seq"
LSN_COLUMN = "_lsn"
XID = "_xid"
COMMIT_TIME = "_commit_time"
ORIGIN = "_origin"
UNCHANGED = "_unchanged"
TEXT = "_text"
OLD = "_old"
OLD_TEXT = "_old_text"

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"
TRUNCATE = "truncate"
OPERATIONS = frozenset({INSERT, UPDATE, DELETE, TRUNCATE})

COMMIT_TIME_TYPE = pa.timestamp("us", tz="UTC")
TEXT_TYPE = pa.map_(pa.string(), pa.string())

# Metadata columns other than ``_old`` (whose type depends on the table), in contract order.
METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(COMMIT_LSN, pa.uint64(), nullable=False),
    pa.field(SEQ, pa.int64(), nullable=False),
    pa.field(LSN_COLUMN, pa.uint64(), nullable=False),
    pa.field(XID, pa.int64()),
    pa.field(COMMIT_TIME, COMMIT_TIME_TYPE, nullable=False),
    pa.field(ORIGIN, pa.string()),
    pa.field(UNCHANGED, pa.list_(pa.string()), nullable=False),
    pa.field(TEXT, TEXT_TYPE),
)
# Columns a change table may leave out: they read as all null.
OPTIONAL_NAMES = frozenset({OLD, TEXT, OLD_TEXT})
# Names the mirror and history use for a row's identity (``pgcdc.sinks.keys``), reserved too.
IDENTITY_NAMES = frozenset({"_pgcdc_key", "_pgcdc_copy", "_pgcdc_old_key", "_pgcdc_old_copy"})
METADATA_NAMES = frozenset(f.name for f in METADATA_FIELDS) | {OLD, OLD_TEXT} | IDENTITY_NAMES


@dataclass(frozen=True)
class TableSpec:
    """What the sinks know about one source table, as of the Relation message at ``relation_lsn``.

    ``schema`` holds the table's columns in order with their Arrow types; ``key_columns`` is the
    replica identity the mirror and history tables are keyed by. With REPLICA IDENTITY FULL and
    no primary key every column is the key, and the mirror and history number the copies of
    identical rows (``pgcdc.sinks.keys``), so they hold as many as the source.
    """

    namespace: str
    name: str
    schema: pa.Schema
    key_columns: tuple[str, ...]
    relation_lsn: LSN
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    # The source's column definitions (with pg_attribute's missing values, see
    # events.Column.missing) when known: what a column added to the Delta table starts with.
    source_columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        names = self.schema.names
        if len(set(names)) != len(names):
            raise InvalidChangeBatch(f"{self.qualified_name}: duplicate column names in {names}")
        reserved = sorted(METADATA_NAMES.intersection(names))
        if reserved:
            raise InvalidChangeBatch(
                f"{self.qualified_name}: column(s) {reserved} clash with the sink's metadata "
                "columns; rename them at the source or leave the table out of the publication"
            )
        missing = [k for k in self.key_columns if k not in names]
        if missing:
            raise InvalidChangeBatch(
                f"{self.qualified_name}: key column(s) {missing} are not among the columns {names}"
            )

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def has_usable_key(self) -> bool:
        """Whether rows can be identified, so the table can have a mirror and a history."""
        return bool(self.key_columns) and self.replica_identity is not ReplicaIdentity.NOTHING

    @property
    def old_is_full_row(self) -> bool:
        """REPLICA IDENTITY FULL: ``_old`` holds every column, detoasted by the server."""
        return self.replica_identity is ReplicaIdentity.FULL

    @classmethod
    def from_relation(
        cls,
        relation: Relation,
        schema: pa.Schema,
        primary_key: Sequence[str] | None = None,
    ) -> TableSpec:
        """Build a spec from a Relation event and the Arrow types of its columns.

        pgoutput flags every column as key under REPLICA IDENTITY FULL, so pass the primary key
        (when the table has one) to key the mirror by it rather than by whole rows.
        """
        table = relation.table
        names = [c.name for c in table.columns]
        if list(schema.names) != names:
            raise InvalidChangeBatch(
                f"{table.qualified_name}: Arrow schema columns {schema.names} do not match the "
                f"Relation's columns {names}"
            )
        keys = tuple(primary_key) if primary_key else tuple(c.name for c in table.key_columns)
        return cls(
            namespace=table.namespace,
            name=table.name,
            schema=schema,
            key_columns=keys,
            relation_lsn=relation.lsn,
            replica_identity=table.replica_identity,
        )


def old_type(spec: TableSpec) -> pa.StructType:
    """The type of ``_old`` for a table: a struct of all its columns."""
    return pa.struct([pa.field(f.name, f.type) for f in spec.schema])


def change_schema(spec: TableSpec) -> pa.Schema:
    """The full Arrow schema of a change table for ``spec`` (table columns, then metadata)."""
    return pa.schema(
        [pa.field(f.name, f.type) for f in spec.schema]
        + list(METADATA_FIELDS)
        + [pa.field(OLD, old_type(spec)), pa.field(OLD_TEXT, TEXT_TYPE)]
    )


def _cast(table: str, column: str, array: pa.Array, to: pa.DataType) -> pa.Array:
    if array.type == to:
        return array
    try:
        return array.cast(to, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidChangeBatch(
            f"{table}: column {column!r} has type {array.type}, expected {to} ({exc}); build "
            "change tables with pgcdc.sinks.changes.change_schema(spec)"
        ) from None


def normalize(spec: TableSpec, changes: pa.Table) -> pa.Table:
    """Check ``changes`` against the contract and return it with exactly ``change_schema(spec)``.

    Safe casts only (a ``large_string`` becomes ``string``, an int64 LSN becomes uint64); a column
    that is missing, unknown, or cannot be cast without loss is an ``InvalidChangeBatch``.
    """
    name = spec.qualified_name
    expected = change_schema(spec)
    unknown = [c for c in changes.column_names if c not in expected.names]
    if unknown:
        raise InvalidChangeBatch(
            f"{name}: change table has column(s) {unknown} that the TableSpec (relation at "
            f"{spec.relation_lsn}) does not know; send the new Relation's TableSpec with the batch"
        )
    missing = [
        c for c in expected.names if c not in changes.column_names and c not in OPTIONAL_NAMES
    ]
    if missing:
        raise InvalidChangeBatch(f"{name}: change table lacks column(s) {missing}")
    arrays: list[pa.Array] = []
    for field in expected:
        if field.name == OLD:
            arrays.append(_normalize_old(spec, changes))
            continue
        if field.name not in changes.column_names:
            arrays.append(pa.nulls(changes.num_rows, field.type))
            continue
        array = contiguous(changes.column(field.name))
        arrays.append(_cast(name, field.name, array, field.type))
    result = pa.Table.from_arrays(arrays, schema=expected)
    _check_rows(spec, result)
    return result


def _normalize_old(spec: TableSpec, changes: pa.Table) -> pa.Array:
    """``_old`` with every table column as a field (fields the server did not send are null)."""
    target = old_type(spec)
    count = changes.num_rows
    if OLD not in changes.column_names:
        return pa.nulls(count, target)
    old = contiguous(changes.column(OLD))
    if not pa.types.is_struct(old.type):
        raise InvalidChangeBatch(f"{spec.qualified_name}: _old must be a struct, not {old.type}")
    present = {old.type.field(i).name: i for i in range(old.type.num_fields)}
    unknown = sorted(set(present) - set(spec.schema.names))
    if unknown:
        raise InvalidChangeBatch(f"{spec.qualified_name}: _old has unknown field(s) {unknown}")
    flat = old.flatten()
    children = [
        _cast(spec.qualified_name, f"_old.{f.name}", flat[present[f.name]], f.type)
        if f.name in present
        else pa.nulls(count, f.type)
        for f in target
    ]
    return pa.StructArray.from_arrays(children, fields=list(target), mask=old.is_null())


def _check_rows(spec: TableSpec, changes: pa.Table) -> None:
    name = spec.qualified_name
    ops = changes.column(OP)
    bad = pc.invert(pc.is_in(ops, value_set=pa.array(sorted(OPERATIONS))))
    if pc.any(bad).as_py():
        first = pc.filter(ops, bad)[0].as_py()
        raise InvalidChangeBatch(
            f"{name}: unknown _op {first!r}; expected one of {sorted(OPERATIONS)}"
        )
    listed = pc.unique(pc.list_flatten(changes.column(UNCHANGED))).to_pylist()
    strangers = sorted(set(listed) - set(spec.schema.names))
    if strangers:
        raise InvalidChangeBatch(f"{name}: _unchanged names unknown column(s) {strangers}")
