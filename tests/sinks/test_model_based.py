"""Random change sequences, split into random batches, against the Python model."""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.sinks import DeltaSink, SinkKind, read_table

from .model import Source, items_spec
from .test_delta import check_all

KEYS = range(6)
Step = tuple[str, int, int, bool, bool]


@st.composite
def programs(draw: st.DrawFn) -> list[list[Step]]:
    """Transactions of abstract steps: (kind, key, other key, toast body?, change name?)."""
    kinds = st.sampled_from(["write", "write", "write", "move", "delete", "truncate"])
    step = st.tuples(
        kinds, st.sampled_from(KEYS), st.sampled_from(KEYS), st.booleans(), st.booleans()
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
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs(), st.lists(st.integers(1, 4), min_size=1, max_size=10))
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
        changelog = read_table(sink.path(src.spec, SinkKind.CHANGELOG))
        assert sorted(changelog.column("_lsn").to_pylist()) == sorted(sent_lsns)
