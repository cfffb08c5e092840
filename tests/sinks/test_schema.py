"""Schema evolution of the Delta tables, and the Arrow -> Delta type mapping."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgcdc.errors import SchemaChangeError
from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.sinks.delta import table_schema
from pgcdc.sinks.schema import (
    INTERVAL_STRUCT,
    UnsupportedType,
    align,
    contiguous,
    delta_type,
    fits,
    to_delta,
)

from .model import Source, items_spec

V1 = pa.schema(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("qty", pa.int16()),
        ("price", pa.decimal128(5, 2)),
        ("ratio", pa.float32()),
    ]
)
# ALTER TABLE: DROP name; qty int2 -> int4; price numeric(5,2) -> numeric(9,3);
# ratio real -> double precision; ADD note text.
V2 = pa.schema(
    [
        ("id", pa.int32()),
        ("qty", pa.int32()),
        ("price", pa.decimal128(9, 3)),
        ("ratio", pa.float64()),
        ("note", pa.string()),
    ]
)
ALL = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)


def _follow(src: Source, spec_schema: pa.Schema, lsn: int) -> Source:
    """The same source after an ALTER TABLE: rows keep only the new columns."""
    spec = items_spec(spec_schema, lsn=lsn)
    after = Source(spec, lsn=src.lsn, xid=src.xid, time=src.time)
    after.rows = {k: {f.name: r.get(f.name) for f in spec_schema} for k, r in src.rows.items()}
    return after


def test_add_drop_and_widen_columns(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, app_id="evo", kinds=ALL)
    src = Source(items_spec(V1))
    src.insert(id=1, name="kept", qty=7, price=Decimal("123.45"), ratio=0.5)
    src.insert(id=2, name="two", qty=2, price=Decimal("1.00"), ratio=1.5)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])

    src2 = _follow(src, V2, lsn=src.lsn + 8)
    src2.update((1,), qty=100_000, price=Decimal("123456.789"), note="n1")
    src2.insert(id=3, qty=3, price=Decimal("0.001"), ratio=1e300, note="new")
    src2.commit()
    sink.write_batch(2, [(src2.spec, src2.take())])

    mirror_path = sink.path(src2.spec, SinkKind.MIRROR)
    schema = table_schema(read_delta(mirror_path))
    assert schema.field("qty").type == pa.int32()
    assert schema.field("price").type == pa.decimal128(9, 3)
    assert schema.field("ratio").type == pa.float64()
    assert schema.field("note").type == pa.string()
    assert "name" in schema.names
    mirror = {r["id"]: r for r in read_table(mirror_path).to_pylist()}
    assert mirror[1]["name"] == "kept"  # dropped column: the mirror row keeps its last value
    assert mirror[1]["qty"] == 100_000
    assert mirror[1]["price"] == Decimal("123456.789")
    assert mirror[2]["price"] == Decimal("1.000")
    assert mirror[2]["ratio"] == 1.5
    assert mirror[2]["note"] is None
    assert mirror[3]["name"] is None
    assert mirror[3]["ratio"] == 1e300

    history = read_table(sink.path(src2.spec, SinkKind.HISTORY))
    current = {r["id"]: r for r in history.filter(pc.field("_is_current")).to_pylist()}
    assert current[1]["name"] is None  # a version opened after the drop has no such column
    assert current[1]["note"] == "n1"
    closed = history.filter(pc.invert(history.column("_is_current"))).to_pylist()
    assert [(r["id"], r["name"], r["qty"]) for r in closed] == [(1, "kept", 7)]

    log = read_table(sink.path(src2.spec, SinkKind.CHANGELOG)).sort_by("_lsn")
    assert log.column("name").to_pylist() == ["kept", "two", None, None]
    assert log.schema.field("_old").type.field("note").type == pa.string()


def test_incompatible_type_change_names_table_column_and_lsn(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, app_id="evo", kinds=ALL)
    src = Source(items_spec(V1))
    src.insert(id=1, name="a", qty=7, price=Decimal("1.00"), ratio=0.5)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    changed = V1.set(V1.get_field_index("qty"), pa.field("qty", pa.string()))
    src2 = _follow(src, changed, lsn=0xABC0)
    src2.update((1,), qty="seven")
    src2.commit()
    with pytest.raises(SchemaChangeError, match=r"public\.items.*'qty'.*0/ABC0") as info:
        sink.write_batch(2, [(src2.spec, src2.take())])
    assert info.value.column == "qty"
    assert info.value.table == "public.items"
    assert info.value.lsn == 0xABC0
    narrower_scale = V1.set(V1.get_field_index("price"), pa.field("price", pa.decimal128(5, 1)))
    src3 = _follow(src, narrower_scale, lsn=0xABD0)
    src3.update((1,), price=Decimal("1.5"))
    src3.commit()
    with pytest.raises(SchemaChangeError, match="'price'"):
        sink.write_batch(2, [(src3.spec, src3.take())])
    # Nothing was written by the refused batches.
    assert read_table(sink.path(src.spec, SinkKind.MIRROR)).column("qty").to_pylist() == [7]


def read_delta(path: str) -> DeltaTable:
    return DeltaTable(path)


@pytest.mark.parametrize(
    ("arrow", "values", "expected_type", "expected"),
    [
        (pa.uint64(), [2**64 - 1, None], pa.decimal128(20, 0), [Decimal(2**64 - 1), None]),
        (pa.uint32(), [2**32 - 1], pa.int64(), [2**32 - 1]),
        (pa.time64("ns"), [dt.time(1, 2, 3, 4)], pa.int64(), [3723000004]),
        (pa.large_string(), ["x", None], pa.string(), ["x", None]),
        (pa.binary(2), [b"ab"], pa.binary(), [b"ab"]),
        (pa.timestamp("ms", tz="Europe/Paris"), [0], pa.timestamp("us", tz="UTC"), None),
        (
            pa.month_day_nano_interval(),
            [pa.MonthDayNano([1, 2, 3])],
            INTERVAL_STRUCT,
            [{"months": 1, "days": 2, "nanoseconds": 3}],
        ),
        (pa.decimal256(50, 0), [Decimal("9" * 50)], pa.string(), ["9" * 50]),
        (
            pa.large_list(pa.uint16()),
            [[1, None], None, []],
            pa.list_(pa.int32()),
            [[1, None], None, []],
        ),
    ],
)
def test_delta_type_mapping_is_lossless(arrow, values, expected_type, expected) -> None:
    array = pa.array(values, arrow)
    converted = to_delta(array)
    assert delta_type(arrow) == expected_type
    assert converted.type == expected_type
    if expected is not None:
        assert converted.to_pylist() == expected
    else:
        assert converted.cast(pa.int64()).to_pylist() == array.cast(pa.int64()).to_pylist()


def test_unsupported_type_is_a_typed_error() -> None:
    with pytest.raises(UnsupportedType, match="no lossless Delta"):
        delta_type(pa.null())


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        (pa.int16(), pa.int32(), True),
        (pa.int32(), pa.int64(), True),
        (pa.int64(), pa.int32(), False),
        (pa.float32(), pa.float64(), True),
        (pa.decimal128(5, 2), pa.decimal128(10, 2), True),
        (pa.decimal128(5, 2), pa.decimal128(5, 3), False),
        (pa.decimal128(5, 2), pa.decimal128(6, 3), True),
        (pa.int32(), pa.decimal128(10, 0), True),
        (pa.int64(), pa.decimal128(18, 0), False),
        (pa.int32(), pa.string(), False),
        (pa.timestamp("us"), pa.timestamp("us", tz="UTC"), False),
    ],
)
def test_widening_rules(src: pa.DataType, dst: pa.DataType, ok: bool) -> None:
    assert fits(src, dst) is ok


def test_spec_from_relation_uses_replica_identity_or_primary_key() -> None:
    from pgcdc.errors import InvalidChangeBatch
    from pgcdc.events import Column, Relation, ReplicaIdentity, Table
    from pgcdc.lsn import LSN
    from pgcdc.sinks import TableSpec

    schema = pa.schema([("id", pa.int32()), ("v", pa.string())])
    keyed = Table("s", "t", (Column("id", 23, is_key=True), Column("v", 25)))
    spec = TableSpec.from_relation(Relation(LSN(0x10), keyed), schema)
    assert (spec.key_columns, spec.relation_lsn, spec.has_usable_key) == (("id",), 0x10, True)
    full = Table(
        "s",
        "t",
        (Column("id", 23, is_key=True), Column("v", 25, is_key=True)),
        replica_identity=ReplicaIdentity.FULL,
    )
    assert TableSpec.from_relation(Relation(LSN(1), full), schema).key_columns == ("id", "v")
    by_pk = TableSpec.from_relation(Relation(LSN(1), full), schema, primary_key=["id"])
    assert by_pk.key_columns == ("id",)
    assert by_pk.old_is_full_row
    nothing = Table(
        "s", "t", (Column("id", 23), Column("v", 25)), replica_identity=ReplicaIdentity.NOTHING
    )
    assert not TableSpec.from_relation(Relation(LSN(1), nothing), schema).has_usable_key
    with pytest.raises(InvalidChangeBatch, match="do not match"):
        TableSpec.from_relation(Relation(LSN(1), keyed), pa.schema([("id", pa.int32())]))
    with pytest.raises(InvalidChangeBatch, match="clash"):
        TableSpec("s", "t", pa.schema([("_op", pa.string())]), (), LSN(1))


def test_contiguous_keeps_a_single_chunk_and_joins_several() -> None:
    """A column of one chunk is used as it is (``combine_chunks`` would copy it), slice offset
    and all; several chunks are joined."""
    sliced = pa.array(range(10), pa.int64()).slice(3, 5)
    one = contiguous(pa.chunked_array([sliced]))
    assert one.buffers()[1].address == sliced.buffers()[1].address
    assert one.offset == 3 and one.to_pylist() == [3, 4, 5, 6, 7]
    several = contiguous(pa.chunked_array([pa.array([1, 2]), pa.array([None, 4])]))
    assert several.to_pylist() == [1, 2, None, 4]
    assert contiguous(pa.chunked_array([], pa.int64())).to_pylist() == []


def test_align_keeps_values_of_sliced_columns() -> None:
    """Columns that are slices of larger arrays (an offset into shared buffers) keep their own
    values through ``align``, structs included, while missing columns come back null and
    narrower types are widened."""
    ids = pa.array(range(8), pa.int32()).slice(2, 4)
    old = pa.StructArray.from_arrays(
        [pa.array(["a", "b", "c", "d", "e", "f", "g", "h"])], names=["name"]
    ).slice(4, 4)
    table = pa.table({"id": ids, "old": old})
    old_type = pa.struct([("name", pa.string()), ("qty", pa.int16())])
    schema = pa.schema([("id", pa.int64()), ("old", old_type), ("qty", pa.int16())])
    aligned = align(table, schema)
    assert aligned.schema == schema
    assert aligned.column("id").to_pylist() == [2, 3, 4, 5]
    assert aligned.column("old").to_pylist() == [{"name": n, "qty": None} for n in "efgh"]
    assert aligned.column("qty").to_pylist() == [None] * 4
