"""Changelog, mirror and history tables against the Python model, with real Delta tables."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.errors import InvalidChangeBatch, UnresolvedToastError
from pgcdc.events import ReplicaIdentity
from pgcdc.lsn import LSN
from pgcdc.sinks import DeltaSink, SinkKind, read_table, write_table
from pgcdc.sinks.changes import TableSpec, change_schema
from pgcdc.sinks.delta import (
    LSN_INFINITY,
    _history_rows,
    _mirror_rows,
    _number_copies,
    _rows,
    compact_if_fragmented,
    fold_history,
    fold_mirror,
    initial_rows,
    prepare,
    table_schema,
)
from pgcdc.sinks.parquet import writer_properties
from pgcdc.sinks.read import partition_values
from pgcdc.sinks.schema import delta_schema
from tests.parquet import dictionary_columns

from .model import ITEMS_SCHEMA, Source, items_spec, state_at

ALL = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple(str(v) for v in r.values()))


def mirror_rows(path: str, columns: list[str]) -> list[dict[str, Any]]:
    return _sorted(read_table(path).select(columns).to_pylist())


def history_at(path: str, columns: list[str], lsn: int) -> list[dict[str, Any]]:
    table = read_table(path)
    mask = pc.and_(
        pc.less_equal(table.column("_valid_from_lsn"), lsn),
        pc.greater(table.column("_valid_to_lsn"), lsn),
    )
    return _sorted(table.filter(mask).select(columns).to_pylist())


def check_all(sink: DeltaSink, source: Source) -> None:
    """Mirror equals the model's final state; history equals it at every commit LSN."""
    columns = source.spec.schema.names
    final = state_at(source.snapshots, source.lsn)
    mirror = sink.path(source.spec, SinkKind.MIRROR)
    if not DeltaTable.is_deltatable(mirror):  # only empty batches so far: no table
        assert all(not state for _, state in source.snapshots)
        return
    assert mirror_rows(mirror, columns) == final
    schema = read_table(mirror).select(columns).schema
    assert schema == delta_schema(source.spec.schema)
    history = sink.path(source.spec, SinkKind.HISTORY)
    for commit_lsn, _ in source.snapshots:
        assert history_at(history, columns, commit_lsn) == state_at(source.snapshots, commit_lsn)
        assert history_at(history, columns, commit_lsn - 1) == state_at(
            source.snapshots, commit_lsn - 1
        )
    current = read_table(history).filter(pc.field("_is_current"))
    assert _sorted(current.select(columns).to_pylist()) == final
    assert pc.all(pc.equal(current.column("_valid_to_lsn"), LSN_INFINITY)).as_py() in (True, None)


@pytest.fixture
def sink(tmp_path: Path) -> DeltaSink:
    return DeltaSink(tmp_path, app_id="test-app", kinds=ALL)


def test_insert_update_delete_across_batches(sink: DeltaSink) -> None:
    src = Source(items_spec())
    src.insert(id=1, name="a", body="x" * 5000, qty=1)
    src.insert(id=2, name="b", body="y", qty=2)
    src.insert(id=3, name="c", body=None, qty=3)
    src.commit()
    src.update((1,), name="a2")
    src.delete((3,))
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    check_all(sink, src)
    src.update((2,), qty=20)
    src.update((2,), qty=21)
    src.commit()
    src.delete((1,))
    src.insert(id=1, name="again", body="z", qty=9)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    check_all(sink, src)
    changelog = read_table(sink.path(src.spec, SinkKind.CHANGELOG))
    assert changelog.num_rows == 9
    assert changelog.column("_op").to_pylist().count("delete") == 2


def test_history_merges_never_rewrite_closed_versions(sink: DeltaSink) -> None:
    """History is partitioned by ``_is_current``: a batch's MERGE closes current versions,
    so it copies (rewrites) current rows only, one per key at most, and the closed versions'
    files, once written, stay (unpartitioned, every MERGE copied the whole history again)."""
    src = Source(items_spec())
    for i in range(50):
        src.insert(id=i, name=f"n{i}", body="b", qty=0)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    path = sink.path(src.spec, SinkKind.HISTORY)
    kept: set[str] = set()
    for batch in range(2, 7):
        for i in range(0, 50, 3):
            src.update((i,), qty=batch)
        src.commit()
        sink.write_batch(batch, [(src.spec, src.take())])
        check_all(sink, src)
        table = DeltaTable(path)
        merge = table.history(1)[0]
        assert merge["operation"] == "MERGE"
        assert merge["operationMetrics"]["num_target_rows_copied"] <= 50 - 17
        files = dict(zip(table.file_uris(), partition_values(table), strict=True))
        assert kept <= files.keys()
        kept = {uri for uri, values in files.items() if values.get("_is_current") is False}
    assert kept
    assert read_table(path).filter(~pc.field("_is_current")).num_rows == 5 * 17


def _new_row_and_row_1_updated(src: Source, batch: int) -> pa.Table:
    """Batch ``batch``'s changes: row ``batch`` inserted, row 1 updated (inserted by batch 1)."""
    src.insert(id=batch, name=f"n{batch}", body="b", qty=batch)
    src.update((1,), qty=10 * batch)
    src.commit()
    return src.take()


def test_a_history_table_made_before_partitioning_is_written_as_before(tmp_path: Path) -> None:
    """A lake from a pgcdc before the partitioned layout: its unpartitioned history table is
    continued as it is, with the same rows."""
    probe, src = DeltaSink(tmp_path / "probe", app_id="probe", kinds=ALL), Source(items_spec())
    src.insert(id=1, name="a", body="x", qty=1)
    src.commit()
    probe.write_batch(1, [(src.spec, src.take())])
    schema = table_schema(DeltaTable(probe.path(src.spec, SinkKind.HISTORY)))
    old = DeltaSink(tmp_path / "old", app_id="test-app", kinds=ALL)
    new = DeltaSink(tmp_path / "new", app_id="test-app", kinds=ALL)
    path = old.path(src.spec, SinkKind.HISTORY)
    DeltaTable.create(path, schema)  # as pgcdc made it before: unpartitioned
    src = Source(items_spec())
    for batch in range(1, 4):
        changes = _new_row_and_row_1_updated(src, batch)
        old.write_batch(batch, [(src.spec, changes)])
        new.write_batch(batch, [(src.spec, changes)])
        check_all(old, src)
    assert DeltaTable(path).metadata().partition_columns == []
    assert DeltaTable(new.path(src.spec, SinkKind.HISTORY)).metadata().partition_columns == [
        "_is_current"
    ]
    columns = [*ITEMS_SCHEMA.names, "_valid_from_lsn", "_valid_to_lsn", "_is_current"]
    assert _sorted(read_table(path).select(columns).to_pylist()) == _sorted(
        read_table(new.path(src.spec, SinkKind.HISTORY)).select(columns).to_pylist()
    )


def test_tables_of_many_small_files_are_compacted_keeping_rows_and_batch_versions(
    tmp_path: Path,
) -> None:
    """Each batch adds files; past ``compact_files`` small ones a table is compacted (OPTIMIZE),
    with the same rows, and a replayed batch is still told apart."""
    sink = DeltaSink(tmp_path, app_id="test-app", kinds=ALL, compact_files=4)
    src = Source(items_spec())
    most = dict.fromkeys(ALL, 0)
    for batch in range(1, 10):
        changes = _new_row_and_row_1_updated(src, batch)
        sink.write_batch(batch, [(src.spec, changes)])
        check_all(sink, src)
        for kind in ALL:
            most[kind] = max(most[kind], len(DeltaTable(sink.path(src.spec, kind)).file_uris()))
    for kind in (SinkKind.CHANGELOG, SinkKind.HISTORY):
        history = DeltaTable(sink.path(src.spec, kind)).history()
        assert "OPTIMIZE" in [h["operation"] for h in history], kind
    assert all(count <= 4 + 1 for count in most.values()), most
    assert read_table(sink.path(src.spec, SinkKind.CHANGELOG)).num_rows == 2 * 9
    replayed = sink.write_batch(9, [(src.spec, changes)])
    assert replayed and not any(r.applied for r in replayed)
    check_all(sink, src)


def test_compaction_keeps_values_of_every_kind_of_column(tmp_path: Path) -> None:
    """Compaction rewrites the files: dates before year 1 and timestamps far off, wide decimals,
    lists, structs and ``_text`` come back as written."""
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("d", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("n", pa.decimal128(38, 10)),
            ("tags", pa.list_(pa.string())),
            ("pair", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ]
    )
    spec = TableSpec("public", "wide", schema, ("id",), LSN(0x100), ReplicaIdentity.DEFAULT)
    path = str(tmp_path / "changelog")
    values = [
        (-800_000, -62_000_000_000_000_000, "-1234567890123456789012345678.0123456789"),
        (2_900_000, 250_000_000_000_000_000, "0.0000000001"),
        (0, 0, "-0"),
    ]
    for version in range(1, 6):
        rows = []
        for i, (days, micros, number) in enumerate(values):
            rows.append(
                {
                    "id": version * 10 + i,
                    "d": days,
                    "ts": micros,
                    "n": Decimal(number),
                    "tags": [f"t{i}", None],
                    "pair": {"a": i, "b": None},
                    "_op": "insert",
                    "_commit_lsn": version * 100,
                    "_seq": i,
                    "_lsn": version * 100 + i,
                    "_xid": version,
                    "_commit_time": T0,
                    "_origin": None,
                    "_unchanged": [],
                    "_text": [("d", "x")] if i else None,
                    "_old": None,
                }
            )
        changes = pa.Table.from_pylist(rows, schema=change_schema(spec))
        write_table(path, spec, changes, SinkKind.CHANGELOG, app_id="a", version=version)
    before = read_table(path).sort_by("id")
    assert compact_if_fragmented(path, 3) is not None
    table = DeltaTable(path)
    assert len(table.file_uris()) == 1
    assert read_table(path).sort_by("id").equals(before)
    assert table.transaction_version("a") == 5


def test_key_change_moves_the_row(sink: DeltaSink) -> None:
    src = Source(items_spec())
    src.insert(id=1, name="a", body="big", qty=1)
    src.insert(id=2, name="b", body="b", qty=2)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.update((1,), id=5, name="moved")
    src.commit()
    src.update((5,), id=6, toast=("body",))
    src.update((2,), id=1)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    check_all(sink, src)
    rows = mirror_rows(sink.path(src.spec, SinkKind.MIRROR), ["id", "body"])
    assert rows == [{"id": 1, "body": "b"}, {"id": 6, "body": "big"}]


def test_truncate_discards_only_what_came_before(sink: DeltaSink) -> None:
    src = Source(items_spec())
    for i in range(5):
        src.insert(id=i, name=f"n{i}", body="b", qty=i)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.update((1,), qty=100)
    src.insert(id=7, name="gone", body="g", qty=7)
    src.commit()
    src.truncate()
    src.insert(id=1, name="after", body="new", qty=1)
    src.commit()
    src.insert(id=2, name="later", body="l", qty=2)
    src.update((1,), toast=("body",), qty=11)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    check_all(sink, src)
    assert mirror_rows(sink.path(src.spec, SinkKind.MIRROR), ["id"]) == [{"id": 1}, {"id": 2}]


def test_truncate_only_batch_empties_the_mirror(sink: DeltaSink) -> None:
    src = Source(items_spec())
    src.insert(id=1, name="a", body="b", qty=1)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.truncate()
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    check_all(sink, src)
    assert read_table(sink.path(src.spec, SinkKind.MIRROR)).num_rows == 0


def test_unchanged_toast_keeps_value_across_batches(sink: DeltaSink) -> None:
    src = Source(items_spec())
    big = "toasted " * 2000
    src.insert(id=1, name="a", body=big, qty=1)
    src.insert(id=2, name="b", body=big + "2", qty=2)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.update((1,), toast=("body",), qty=2)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    src.update((1,), toast=("body",), qty=3)
    src.update((1,), toast=("body",), name="a3")
    src.update((2,), toast=("body",), id=3)
    src.commit()
    sink.write_batch(3, [(src.spec, src.take())])
    check_all(sink, src)
    bodies = mirror_rows(sink.path(src.spec, SinkKind.MIRROR), ["id", "body"])
    assert bodies == [{"id": 1, "body": big}, {"id": 3, "body": big + "2"}]
    changelog = read_table(sink.path(src.spec, SinkKind.CHANGELOG))
    updates = changelog.filter(pc.equal(changelog.column("_op"), "update"))
    assert updates.column("body").null_count == updates.num_rows
    assert all(u == ["body"] for u in updates.column("_unchanged").to_pylist())


def test_unchanged_toast_from_full_old_row(sink: DeltaSink) -> None:
    """With REPLICA IDENTITY FULL the old row carries the value, even if the target lacks it."""
    src = Source(items_spec(identity=ReplicaIdentity.FULL))
    src.rows[(1,)] = {"id": 1, "name": "pre", "body": "from before the sink", "qty": 1}
    src.update((1,), toast=("body",), qty=5)
    for change in src.pending:
        change["_old"] = {"id": 1, "name": "pre", "body": "from before the sink", "qty": 1}
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    check_all(sink, src)


def test_unchanged_toast_without_any_base_is_an_error(tmp_path: Path) -> None:
    src = Source(items_spec())
    src.rows[(1,)] = {"id": 1, "name": "pre", "body": "never seen", "qty": 1}
    src.update((1,), toast=("body",), qty=5)
    src.commit()
    path = tmp_path / "mirror"
    with pytest.raises(UnresolvedToastError, match=r"'body'.*initial snapshot"):
        write_table(path, src.spec, src.take(), SinkKind.MIRROR, app_id="a", version=1)


def test_replayed_batch_changes_nothing(sink: DeltaSink) -> None:
    spec_a = items_spec(name="a")
    spec_b = items_spec(name="b")
    a, b = Source(spec_a), Source(spec_b)
    a.insert(id=1, name="a", body="x", qty=1)
    b.insert(id=1, name="b", body="y", qty=1)
    a.commit()
    b.commit()
    batch1 = [(spec_a, a.take()), (spec_b, b.take())]
    assert all(r.applied for r in sink.write_batch(1, batch1))
    a.update((1,), qty=2)
    b.delete((1,))
    a.commit()
    b.commit()
    batch2 = [(spec_a, a.take()), (spec_b, b.take())]
    # A crash after table a got batch 2 but before b did: replaying batch 2 finishes b only.
    write_table(
        sink.path(spec_a, SinkKind.MIRROR),
        spec_a,
        batch2[0][1],
        SinkKind.MIRROR,
        app_id="test-app",
        version=2,
    )
    results = sink.write_batch(2, batch2)
    applied = {(r.table, r.kind) for r in results if r.applied}
    assert ("public.a", SinkKind.MIRROR) not in applied
    assert ("public.b", SinkKind.MIRROR) in applied
    check_all(sink, a)
    check_all(sink, b)
    before = {
        p: read_table(p) for spec in (spec_a, spec_b) for p in (sink.path(spec, k) for k in ALL)
    }
    for version in (1, 2):
        batch = batch1 if version == 1 else batch2
        assert not any(r.applied for r in sink.write_batch(version, batch))
    for path, table in before.items():
        assert read_table(path).equals(table)
    check_all(sink, a)
    check_all(sink, b)


def test_table_without_key_gets_changelog_only(tmp_path: Path) -> None:
    spec = items_spec(keys=(), identity=ReplicaIdentity.DEFAULT, name="nokey")
    src = Source(spec)
    src.insert(id=1, name="a", body="b", qty=1)
    src.commit()
    sink = DeltaSink(tmp_path, app_id="x", kinds=ALL)
    with pytest.warns(UserWarning, match=r"public\.nokey.*primary key.*REPLICA IDENTITY FULL"):
        results = sink.write_batch(1, [(spec, src.take())])
    assert [r.kind for r in results] == [SinkKind.CHANGELOG]
    assert read_table(sink.path(spec, SinkKind.CHANGELOG)).num_rows == 1
    assert not (tmp_path / "public" / "nokey" / "mirror").exists()
    with pytest.raises(InvalidChangeBatch, match="REPLICA IDENTITY FULL"):
        write_table(tmp_path / "m", spec, src.take(), SinkKind.MIRROR, app_id="x", version=1)


def test_replica_identity_full_without_primary_key(sink: DeltaSink) -> None:
    spec = items_spec(keys=tuple(ITEMS_SCHEMA.names), identity=ReplicaIdentity.FULL)
    src = Source(spec)
    src.insert(id=1, name=None, body="b", qty=1)
    src.insert(id=2, name="n", body="c", qty=2)
    src.commit()
    sink.write_batch(1, [(spec, src.take())])
    src.update((1, None, "b", 1), qty=10)
    src.delete((2, "n", "c", 2))
    src.commit()
    sink.write_batch(2, [(spec, src.take())])
    check_all(sink, src)


def test_changelog_columns(sink: DeltaSink) -> None:
    src = Source(items_spec())
    src.insert(id=1, name="a", body="b", qty=1)
    src.update((1,), id=2)
    commit_lsn = src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    log = read_table(sink.path(src.spec, SinkKind.CHANGELOG)).sort_by("_seq")
    assert log.column("_op").to_pylist() == ["insert", "update"]
    assert log.column("_commit_lsn").to_pylist() == [commit_lsn, commit_lsn]
    assert log.column("_xid").to_pylist() == [700, 700]
    assert log.column("_old").to_pylist()[1] == {"id": 1, "name": None, "body": None, "qty": None}
    assert log.schema.field("_commit_lsn").type == pa.int64()
    assert log.schema.field("_old").type == pa.struct(list(delta_schema(ITEMS_SCHEMA)))


def test_batches_write_plain_pages_where_values_do_not_repeat(sink: DeltaSink) -> None:
    """A batch's files get a dictionary for the columns whose values repeat and plain pages
    for those whose values are distinct (a dictionary there costs a hash of every value)."""
    src = Source(items_spec())
    for i in range(2_000):
        src.insert(id=i, name=f"name {i}", body="same", qty=i % 7)
        if i % 4 == 3:
            src.commit()
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    for kind, distinct in (
        (SinkKind.CHANGELOG, {"id", "name", "_lsn"}),
        (SinkKind.MIRROR, {"id", "name", "_pgcdc_key"}),
    ):
        dictionary = dictionary_columns(*DeltaTable(sink.path(src.spec, kind)).file_uris())
        assert not distinct & dictionary, (kind, distinct & dictionary)
        assert {"body", "qty", "_commit_lsn"} <= dictionary, (kind, dictionary)
    check_all(sink, src)


def test_bad_batches_are_typed_errors(tmp_path: Path) -> None:
    src = Source(items_spec())
    src.insert(id=1, name="a", body="b", qty=1)
    src.commit()
    good = src.take()
    path = tmp_path / "t"
    with pytest.raises(InvalidChangeBatch, match="does not know"):
        write_table(
            path,
            src.spec,
            good.append_column("extra", pa.array([1])),
            SinkKind.MIRROR,
            app_id="a",
            version=1,
        )
    with pytest.raises(InvalidChangeBatch, match="lacks"):
        write_table(
            path, src.spec, good.drop_columns(["_seq"]), SinkKind.MIRROR, app_id="a", version=1
        )
    bad_op = good.set_column(good.schema.get_field_index("_op"), "_op", pa.array(["upsert"]))
    with pytest.raises(InvalidChangeBatch, match="unknown _op 'upsert'"):
        write_table(path, src.spec, bad_op, SinkKind.MIRROR, app_id="a", version=1)
    huge = good.set_column(
        good.schema.get_field_index("_commit_lsn"), "_commit_lsn", pa.array([1 << 63], pa.uint64())
    )
    with pytest.raises(InvalidChangeBatch, match="2\\*\\*63"):
        write_table(path, src.spec, huge, SinkKind.MIRROR, app_id="a", version=1)
    with pytest.raises(InvalidChangeBatch, match="more than once"):
        DeltaSink(tmp_path, app_id="a").write_batch(1, [(src.spec, good), (src.spec, good)])


# --- an initial snapshot's rows ----------------------------------------------------------------


def folded_initial_rows(kind: SinkKind, dspec: TableSpec, changes: pa.Table) -> pa.Table:
    """The reference for ``initial_rows``: each kind's rows as its fold builds them for a batch
    landing in an empty table, as every batch's writer does."""
    if kind is SinkKind.CHANGELOG:
        return changes
    if kind is SinkKind.MIRROR:
        changes = _number_copies(dspec, None, changes, current_only=False)
        folded = fold_mirror(dspec, changes)
        assert folded is not None and folded[1].num_rows == 0
        lineage = folded[0]
        rows = _rows(dspec, changes, lineage)
        return _mirror_rows(dspec, changes, rows, lineage.to_pylist())
    changes = _number_copies(dspec, None, changes, current_only=True)
    history = fold_history(dspec, changes)
    assert history is not None
    rows = _rows(dspec, changes, pa.array(history.starts))
    return _history_rows(dspec, changes, rows, history.starts, history.ends)


SPECS = {
    "key": items_spec(),
    "composite key": items_spec(keys=("name", "id")),
    "keyless full": items_spec(keys=tuple(ITEMS_SCHEMA.names), identity=ReplicaIdentity.FULL),
}
item = st.tuples(st.integers(0, 5), st.sampled_from([None, "a", "b"]), st.integers(0, 2))


@pytest.mark.parametrize("shape", sorted(SPECS))
@given(items=st.lists(item, max_size=12))
def test_initial_rows_are_what_the_folds_build(shape: str, items: list[Any]) -> None:
    spec = SPECS[shape]
    src = Source(spec)
    seen = set()
    for index, (ident, name, qty) in enumerate(items):
        # Keys in and out of order (distinct: the index, signed by qty).
        distinct = index if qty else -index
        row = {"id": ident if shape == "keyless full" else distinct, "name": name, "qty": qty}
        if shape == "composite key" and (name, row["id"]) in seen:
            continue
        seen.add((name, row["id"]))
        src.insert(**row, body="x")  # keyless: the same row may come again
    src.commit()
    dspec, changes = prepare(spec, src.take())
    built = initial_rows(ALL, dspec, changes)
    assert list(built) == list(ALL)
    for kind in ALL:
        assert built[kind].equals(folded_initial_rows(kind, dspec, changes))
        assert initial_rows([kind], dspec, changes)[kind].equals(built[kind])


def test_initial_rows_refuse_what_a_snapshot_cannot_hold() -> None:
    spec = items_spec()
    for make in ("same key", "update"):
        src = Source(spec)
        src.insert(id=1, name="a", body="x", qty=1)
        if make == "same key":
            src.insert(id=1, name="b", body="y", qty=2)
        else:
            src.update((1,), qty=3)
        src.commit()
        dspec, changes = prepare(spec, src.take())
        for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
            with pytest.raises(InvalidChangeBatch, match="INSERTs of distinct rows"):
                initial_rows([kind], dspec, changes)


def test_writer_properties_take_columns_arrow_cannot_count() -> None:
    """Columns of types ``count_distinct`` has no kernel for keep the default (a dictionary)
    rather than failing the write."""
    rows = pa.table(
        {
            "nothing": pa.array([None] * 600, pa.null()),
            "view": pa.array([str(i) for i in range(600)], pa.string_view()),
            "id": pa.array(range(600), pa.int64()),
        }
    )
    assert writer_properties(rows) is not None
