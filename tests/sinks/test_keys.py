"""Mirror and history rows matched by their exact key encoding (``pgcdc.sinks.keys``), through
the real sink functions and real Delta tables: keys held only as text, NaN in REPLICA IDENTITY
FULL rows, identical rows, unchanged TOAST held as text, dates delta-rs or Python cannot hold,
and tables written before the key column existed."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake

from pgcdc.errors import SinkError
from pgcdc.events import ReplicaIdentity
from pgcdc.lsn import LSN
from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.sinks import keys as k
from pgcdc.sinks.changes import TableSpec, change_schema

ALL = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
T0 = datetime(2025, 1, 1, tzinfo=UTC)
FAR = 2_145_042_905  # 5874897-12-31, PostgreSQL's last date, in days since 1970
BC = -738_814  # 0054-03-14 BC


class Feed:
    """Change rows of one table, one transaction per ``commit``."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.rows: list[dict[str, Any]] = []
        self.lsn = 0x1000
        self.seq = 0

    def add(
        self,
        op: str,
        new: dict[str, Any] | None = None,
        old: dict[str, Any] | None = None,
        *,
        text: dict[str, str] | None = None,
        old_text: dict[str, str] | None = None,
        unchanged: tuple[str, ...] = (),
    ) -> None:
        self.lsn += 0x10
        row: dict[str, Any] = {f.name: None for f in self.spec.schema}
        row.update(new or {})
        row.update(
            _op=op, _commit_lsn=None, _seq=self.seq, _lsn=self.lsn, _xid=1, _commit_time=T0,
            _origin=None, _unchanged=list(unchanged),
            _text=None if text is None else list(text.items()),
            _old=old, _old_text=None if old_text is None else list(old_text.items()),
        )  # fmt: skip
        self.seq += 1
        self.rows.append(row)

    def commit(self) -> None:
        self.lsn += 0x10
        for row in self.rows:
            if row["_commit_lsn"] is None:
                row["_commit_lsn"] = self.lsn
        self.seq = 0

    def take(self) -> pa.Table:
        self.commit()
        rows, self.rows = self.rows, []
        return pa.Table.from_pylist(rows, schema=change_schema(self.spec))


def _texts(path: str, columns: list[str], *, current: bool = False) -> list[tuple[Any, ...]]:
    """Rows as (column value or its text form, ...), dates as day numbers, sorted."""
    table = read_table(path)
    if current:
        table = table.filter(pc.field("_is_current"))
    values = []
    for name in columns:
        column = table.column(name)
        if pa.types.is_date32(column.type):
            column = column.cast(pa.int32())
        elif pa.types.is_list(column.type) and pa.types.is_date32(column.type.value_type):
            column = column.cast(pa.list_(pa.int32()))
        values.append(column.to_pylist())
    texts = [dict(t or []) for t in table.column("_text").to_pylist()]
    rows = [
        tuple(texts[i].get(n, values[j][i]) for j, n in enumerate(columns))
        for i in range(table.num_rows)
    ]
    return sorted(rows, key=str)


def _check(sink: DeltaSink, spec: TableSpec, expected: list[tuple[Any, ...]]) -> None:
    columns = spec.schema.names
    expected = sorted(expected, key=str)
    assert _texts(sink.path(spec, SinkKind.MIRROR), columns) == expected
    assert _texts(sink.path(spec, SinkKind.HISTORY), columns, current=True) == expected


DATES = pa.schema([("d", pa.date32()), ("v", pa.int32())])


def _spec(schema: pa.Schema, keys: tuple[str, ...], full: bool = False) -> TableSpec:
    identity = ReplicaIdentity.FULL if full else ReplicaIdentity.DEFAULT
    return TableSpec("public", "t", schema, keys, LSN(0x100), identity)


@pytest.mark.parametrize("batches", [1, 2])
def test_keys_held_only_as_text_stay_distinct(tmp_path: Path, batches: int) -> None:
    """Defect 1: infinity and -infinity keys (typed value null) are different rows."""
    spec = _spec(DATES, ("d",))
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    feed.add("insert", {"v": 1}, text={"d": "infinity"})
    feed.add("insert", {"v": 2}, text={"d": "-infinity"})
    feed.add("insert", {"d": 18262, "v": 3})
    if batches == 2:
        sink.write_batch(1, [(spec, feed.take())])
        _check(sink, spec, [("infinity", 1), ("-infinity", 2), (18262, 3)])
    feed.add("delete", old={"d": None}, old_text={"d": "-infinity"})
    feed.add("update", {"v": 10}, text={"d": "infinity"})
    # A key change from a typed key to a text-form key.
    feed.add("update", {"v": 3}, {"d": 18262}, text={"d": "-infinity"})
    sink.write_batch(2, [(spec, feed.take())])
    _check(sink, spec, [("infinity", 10), ("-infinity", 3)])


def test_full_rows_holding_nan_are_matched(tmp_path: Path) -> None:
    """Defect 2: a FULL row with float NaN and numeric NaN (text only) is updated, then
    deleted; no stale copy stays next to the new one."""
    schema = pa.schema([("f", pa.float64()), ("n", pa.decimal128(10, 2)), ("note", pa.string())])
    spec = _spec(schema, ("f", "n", "note"), full=True)
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    nan = float("nan")
    feed.add("insert", {"f": nan, "note": "a"}, text={"n": "NaN"})
    feed.add("insert", {"f": 1.0, "n": Decimal("2.50"), "note": "b"})
    sink.write_batch(1, [(spec, feed.take())])
    feed.add("update", {"f": nan, "note": "a2"}, {"f": nan, "note": "a"}, text={"n": "NaN"},
             old_text={"n": "NaN"})  # fmt: skip
    feed.add("update", {"f": 1.0, "n": Decimal("2.50"), "note": "b2"},
             {"f": 1.0, "n": Decimal("2.50"), "note": "b"})  # fmt: skip
    sink.write_batch(2, [(spec, feed.take())])
    rows = _texts(sink.path(spec, SinkKind.MIRROR), ["n", "note"])
    assert rows == [("NaN", "a2"), (Decimal("2.50"), "b2")]
    _check_counts(sink, spec, 2)
    feed.add("delete", old={"f": nan, "note": "a2"}, old_text={"n": "NaN"})
    sink.write_batch(3, [(spec, feed.take())])
    assert _texts(sink.path(spec, SinkKind.MIRROR), ["n", "note"]) == [(Decimal("2.50"), "b2")]
    _check_counts(sink, spec, 1)


def _check_counts(sink: DeltaSink, spec: TableSpec, rows: int) -> None:
    assert read_table(sink.path(spec, SinkKind.MIRROR)).num_rows == rows
    history = read_table(sink.path(spec, SinkKind.HISTORY)).filter(pc.field("_is_current"))
    assert history.num_rows == rows


ITEMS = pa.schema([("id", pa.int32()), ("note", pa.string())])


@pytest.mark.parametrize("batches", [1, 2])
def test_identical_rows_keep_their_multiplicity(tmp_path: Path, batches: int) -> None:
    """Defect 6: a keyless FULL table keeps every copy of identical rows; a DELETE removes
    one copy, an UPDATE changes one copy."""
    spec = _spec(ITEMS, ("id", "note"), full=True)
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    for _ in range(3):
        feed.add("insert", {"id": 1, "note": "dup"})
    feed.add("insert", {"id": 2, "note": None})
    feed.add("insert", {"id": 2, "note": None})
    if batches == 2:
        sink.write_batch(1, [(spec, feed.take())])
        _check(sink, spec, [(1, "dup")] * 3 + [(2, None)] * 2)
    feed.add("delete", old={"id": 1, "note": "dup"})
    feed.add("update", {"id": 1, "note": "changed"}, {"id": 1, "note": "dup"})
    feed.add("delete", old={"id": 2, "note": None})
    feed.add("insert", {"id": 2, "note": None})
    feed.add("insert", {"id": 2, "note": None})
    sink.write_batch(2, [(spec, feed.take())])
    _check(sink, spec, [(1, "dup"), (1, "changed")] + [(2, None)] * 3)
    feed.add("delete", old={"id": 2, "note": None})
    feed.add("insert", {"id": 1, "note": "dup"})
    sink.write_batch(3, [(spec, feed.take())])
    _check(sink, spec, [(1, "dup"), (1, "dup"), (1, "changed")] + [(2, None)] * 2)


ARRAYS = pa.schema([("id", pa.int32()), ("a", pa.list_(pa.int32())), ("v", pa.int32())])
MATRIX = "{{1,2},{3,4}}"


@pytest.mark.parametrize("batches", [1, 2])
def test_unchanged_toast_keeps_its_text_form(tmp_path: Path, batches: int) -> None:
    """Defect 4: an unchanged TOASTed value held only as text (a 2-D array) keeps it."""
    spec = _spec(ARRAYS, ("id",))
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    feed.add("insert", {"id": 1, "v": 1}, text={"a": MATRIX})
    feed.add("insert", {"id": 2, "a": [5], "v": 1})
    if batches == 2:
        sink.write_batch(1, [(spec, feed.take())])
    feed.add("update", {"id": 1, "v": 2}, unchanged=("a",))
    feed.add("update", {"id": 2, "v": 2}, unchanged=("a",))
    feed.add("update", {"id": 1, "v": 3}, unchanged=("a",))
    sink.write_batch(2, [(spec, feed.take())])
    _check(sink, spec, [(1, MATRIX, 3), (2, [5], 2)])
    history = _texts(sink.path(spec, SinkKind.HISTORY), ["id", "a", "v"])
    assert [r for r in history if r[0] == 1] == [(1, MATRIX, v) for v in (1, 2, 3)]


def test_unchanged_toast_of_a_full_row_keeps_its_text_form(tmp_path: Path) -> None:
    spec = _spec(ARRAYS, ("id",), full=True)
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    feed.add("update", {"id": 1, "v": 2}, {"id": 1, "v": 1}, old_text={"a": MATRIX},
             unchanged=("a",))  # fmt: skip
    sink.write_batch(1, [(spec, feed.take())])
    _check(sink, spec, [(1, MATRIX, 2)])


def test_dates_python_and_delta_rs_cannot_hold(tmp_path: Path) -> None:
    """Defect 8: BC and post-9999 dates in keys and FULL rows land and read back; the dates
    beyond delta-rs' range (after year 262142) are kept as text."""
    spec = _spec(DATES, ("d",))
    full = TableSpec("public", "f", DATES, ("d", "v"), LSN(0x100), ReplicaIdentity.FULL)
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feeds = {name: Feed(s) for name, s in (("key", spec), ("full", full))}
    for feed in feeds.values():
        for day, v in ((BC, 1), (FAR, 2), (3_000_000, 3), (0, 4)):
            feed.add("insert", {"d": day, "v": v})
    sink.write_batch(1, [(s, feeds[n].take()) for n, s in (("key", spec), ("full", full))])
    expected = [(BC, 1), ("5874897-12-31", 2), (3_000_000, 3), (0, 4)]
    _check(sink, spec, expected)
    _check(sink, full, expected)
    feeds["key"].add("update", {"d": BC, "v": 10})
    feeds["key"].add("delete", old={"d": FAR})
    feeds["key"].add("update", {"d": FAR, "v": 30}, {"d": 3_000_000})
    feeds["full"].add("update", {"d": BC, "v": 10}, {"d": BC, "v": 1})
    feeds["full"].add("delete", old={"d": FAR, "v": 2})
    feeds["full"].add("update", {"d": FAR, "v": 30}, {"d": 3_000_000, "v": 3})
    sink.write_batch(2, [(s, feeds[n].take()) for n, s in (("key", spec), ("full", full))])
    expected = [(BC, 10), ("5874897-12-31", 30), (0, 4)]
    _check(sink, spec, expected)
    _check(sink, full, expected)
    changelog = read_table(sink.path(full, SinkKind.CHANGELOG))
    old_texts = [dict(t or []) for t in changelog.column("_old_text").to_pylist()]
    assert {"d": "5874897-12-31"} in old_texts


def test_date_arrays_delta_rs_cannot_hold(tmp_path: Path) -> None:
    """A date array holding a date after year 262142 is kept as its text, whole."""
    schema = pa.schema([("id", pa.int32()), ("ds", pa.list_(pa.date32()))])
    spec = _spec(schema, ("id",))
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(spec)
    feed.add("insert", {"id": 1, "ds": [FAR, BC, None]})
    feed.add("insert", {"id": 2, "ds": [BC, 0]})
    sink.write_batch(1, [(spec, feed.take())])
    expected = [(1, '{5874897-12-31,"0054-03-14 BC",NULL}'), (2, [BC, 0])]
    _check(sink, spec, expected)
    assert _texts(sink.path(spec, SinkKind.CHANGELOG), ["id", "ds"]) == sorted(expected, key=str)


def test_widening_a_key_column_of_a_table_with_bc_dates(tmp_path: Path) -> None:
    """The rewrite a widening needs reads BC dates back; the widened key still matches."""
    narrow = pa.schema([("id", pa.int16()), ("d", pa.date32())])
    wide = pa.schema([("id", pa.int32()), ("d", pa.date32())])
    sink = DeltaSink(tmp_path, app_id="t", kinds=ALL)
    feed = Feed(_spec(narrow, ("id",)))
    feed.add("insert", {"id": 1, "d": BC})
    feed.add("insert", {"id": 2, "d": BC})
    sink.write_batch(1, [(feed.spec, feed.take())])
    feed.spec = _spec(wide, ("id",))
    feed.add("update", {"id": 1, "d": 0})
    feed.add("delete", old={"id": 2})
    sink.write_batch(2, [(feed.spec, feed.take())])
    _check(sink, feed.spec, [(1, 0)])


def test_key_encoding_is_exact() -> None:
    """Distinct values get distinct keys, whatever their form; equal values equal keys."""
    strings = pa.array([None, "", "N", "V0:", "infinity", "infinity"])
    texts = pa.array([None, None, None, None, None, "infinity"])
    encoded = k.encode([strings], [texts]).to_pylist()
    assert len(set(encoded)) == len(encoded)
    pairs = k.encode(
        [pa.array(["a", "ab", None]), pa.array(["bc", "c", "abc"])], [None, None]
    ).to_pylist()
    assert len(set(pairs)) == 3
    lists = pa.array([[1, 2], [12], [1, None], None, [], [None]], pa.list_(pa.int32()))
    encoded = k.encode([lists], [None]).to_pylist()
    assert len(set(encoded)) == len(encoded)
    assert k.encode([lists.slice(1, 2)], [None]).to_pylist() == encoded[1:3]
    decimals = k.encode([pa.array([Decimal("1.50"), Decimal("1.5"), Decimal("10")])], [None])
    wider = k.encode([pa.array([Decimal("1.500")], pa.decimal128(12, 3))], [None])
    assert decimals[0] == decimals[1] == wider[0] != decimals[2]
    assert k.encode([pa.array([10], pa.int64())], [None]) == decimals.slice(2)
    nan = k.encode([pa.array([float("nan"), float("nan"), 0.0])], [None]).to_pylist()
    assert nan[0] == nan[1] != nan[2]


def test_a_table_written_before_keys_is_a_clear_error(tmp_path: Path) -> None:
    spec = _spec(ITEMS, ("id",))
    sink = DeltaSink(tmp_path, app_id="t", kinds=(SinkKind.MIRROR,))
    old_layout = pa.table(
        {
            "id": pa.array([1], pa.int32()),
            "note": ["x"],
            "_commit_lsn": pa.array([1], pa.int64()),
            "_commit_time": pa.array([T0], pa.timestamp("us", tz="UTC")),
            "_text": pa.array([None], pa.map_(pa.string(), pa.string())),
        }
    )
    write_deltalake(sink.path(spec, SinkKind.MIRROR), old_layout)
    feed = Feed(spec)
    feed.add("insert", {"id": 2, "note": "y"})
    with pytest.raises(SinkError, match=r"older pgcdc.*_pgcdc_key.*fresh snapshot"):
        sink.write_batch(1, [(spec, feed.take())])
