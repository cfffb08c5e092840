"""Random change sequences, split into random batches, against the Python model.

Batches with TRUNCATE or unchanged TOAST take ``plan``; the others fold in Arrow
(``fold_mirror``, ``fold_history``). The model test writes both kinds; the fold test checks the
folds give exactly what ``plan`` gives on the same batches."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgcdc.events import ReplicaIdentity
from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.sinks.changes import TableSpec
from pgcdc.sinks.delta import fold_history, fold_mirror, prepare
from pgcdc.sinks.keys import identity_columns
from pgcdc.sinks.plan import plan
from tests.conftest import examples

from .model import Source, items_spec
from .test_delta import check_all

KEYS = range(6)
Step = tuple[str, int, int, bool, bool]


@st.composite
def programs(draw: st.DrawFn, foldable: bool = False) -> list[list[Step]]:
    """Transactions of abstract steps: (kind, key, other key, toast body?, change name?).
    ``foldable``: no TRUNCATE and no unchanged TOAST, so every batch folds in Arrow."""
    choices = ["write", "write", "write", "move", "delete"] + ([] if foldable else ["truncate"])
    step = st.tuples(
        st.sampled_from(choices),
        st.sampled_from(KEYS),
        st.sampled_from(KEYS),
        st.just(False) if foldable else st.booleans(),
        st.booleans(),
    )
    return draw(st.lists(st.lists(step, min_size=1, max_size=4), min_size=1, max_size=10))


def _run(src: Source, steps: list[Step], counter: list[int]) -> None:
    for kind, key, other, toast, rename in steps:
        counter[0] += 1
        n = counter[0]
        present = (key,) in src.rows
        if kind == "truncate":
            src.truncate()
        elif kind == "delete" and present:
            src.delete((key,))
        elif kind == "move" and present and (other,) not in src.rows:
            src.update((key,), id=other, toast=("body",) if toast else ())
        elif present:
            values: dict[str, Any] = {"qty": n}
            if rename:
                values["name"] = f"name{n}"
            src.update((key,), toast=("body",) if toast else (), **values)
        elif kind != "delete":
            src.insert(id=key, name=f"new{n}", body=f"body{n}-" * (n % 3 + 1), qty=n)


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.lists(st.integers(1, 4), min_size=1, max_size=10))
# A first batch whose only step deletes a row that is not there sends the table no change:
# its mirror and history must still exist (empty), and later batches land on them.
@example(program=[[("delete", 0, 0, False, False)]], batch_sizes=[1])
@example(
    program=[
        [("delete", 0, 0, False, False)],
        [("write", 1, 0, False, False)],
        [("delete", 1, 0, False, False)],
    ],
    batch_sizes=[1],
)
def test_random_changes_in_random_batches(
    program: list[list[Step]], batch_sizes: list[int]
) -> None:
    src = Source(items_spec())
    counter = [0]
    with tempfile.TemporaryDirectory() as root:
        sink = DeltaSink(root, app_id="prop", kinds=tuple(SinkKind))
        version = 0
        sent_lsns: list[int] = []
        position = 0
        sizes = iter(batch_sizes * len(program))
        while position < len(program):
            size = next(sizes)
            for steps in program[position : position + size]:
                _run(src, steps, counter)
                src.commit()
            position += size
            version += 1
            batch = src.take()
            sent_lsns += batch.column("_lsn").to_pylist()
            sink.write_batch(version, [(src.spec, batch)])
            if version == 2:
                # A replay of the batch just written must not change anything.
                assert not any(r.applied for r in sink.write_batch(version, [(src.spec, batch)]))
        check_all(sink, src)
        if sent_lsns:  # batches without changes create no table
            changelog = read_table(sink.path(src.spec, SinkKind.CHANGELOG))
            assert sorted(changelog.column("_lsn").to_pylist()) == sorted(sent_lsns)


def _fold_equals_plan(spec: TableSpec, batch: pa.Table) -> bool:
    """Whether the batch folded; if it did, the folds must say what ``plan`` says."""
    dspec, changes = prepare(spec, batch)
    history = fold_history(dspec, changes)
    mirror = fold_mirror(dspec, changes)
    assert (history is None) == (mirror is None)
    if history is None or mirror is None:
        return False
    p = plan(dspec, changes)
    assert history.starts.tolist() == [v.row for v in p.versions]
    assert history.ends.tolist() == [-1 if v.closed_by is None else v.closed_by for v in p.versions]
    keys = identity_columns(dspec)  # rows are matched by their key encoding
    touched = zip(*(history.target_keys.column(k).to_pylist() for k in keys), strict=True)
    assert dict(zip(touched, history.target_ends.tolist(), strict=True)) == p.target_closed
    rows, deleted = mirror
    assert rows.to_pylist() == sorted(v.row for v in p.final.values() if v is not None)
    gone = set(zip(*(deleted.column(k).to_pylist() for k in keys), strict=True))
    assert gone == {k for k, v in p.final.items() if v is None}
    return True


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.booleans(),
    programs(foldable=True),
    programs(),
    st.sampled_from([ReplicaIdentity.DEFAULT, ReplicaIdentity.FULL]),
)
def test_folds_equal_plan(
    foldable_first: bool,
    foldable: list[list[Step]],
    general: list[list[Step]],
    identity: ReplicaIdentity,
) -> None:
    src = Source(items_spec(identity=identity))
    counter = [0]
    first, second = (foldable, general) if foldable_first else (general, foldable)
    for steps in first:
        _run(src, steps, counter)
        src.commit()
    folded = _fold_equals_plan(src.spec, src.take())
    assert folded or not foldable_first
    for steps in second:
        _run(src, steps, counter)
        src.commit()
    folded = _fold_equals_plan(src.spec, src.take())
    assert folded or foldable_first


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.randoms(use_true_random=False))
def test_prepare_orders_any_input(steps: list[list[Step]], random: Any) -> None:
    """A batch in log order is kept as it is; any other order is sorted to the same table."""
    src = Source(items_spec())
    counter = [0]
    for transaction in steps:
        _run(src, transaction, counter)
        src.commit()
    batch = src.take()
    _, ordered = prepare(src.spec, batch)
    order = list(range(batch.num_rows))
    random.shuffle(order)
    _, shuffled = prepare(src.spec, batch.take(pa.array(order, pa.int64())))
    assert shuffled.equals(ordered)
    assert ordered.column("_lsn").to_pylist() == sorted(ordered.column("_lsn").to_pylist())


def test_a_first_batch_of_only_a_delete_leaves_empty_tables_later_batches_fill(
    tmp_path: Path,
) -> None:
    """The row existed before the sink saw the table (no snapshot): its DELETE comes first."""
    src = Source(items_spec())
    src.rows[(1,)] = {"id": 1, "name": "before", "body": "b", "qty": 1}
    src.delete((1,))
    src.commit()
    sink = DeltaSink(tmp_path, app_id="first", kinds=tuple(SinkKind))
    sink.write_batch(1, [(src.spec, src.take())])
    for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
        assert read_table(sink.path(src.spec, kind)).num_rows == 0
    src.insert(id=1, name="again", body="c", qty=2)
    src.insert(id=2, name="new", body="d", qty=3)
    src.commit()
    src.delete((2,))
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    check_all(sink, src)
