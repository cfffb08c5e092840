"""The history (SCD2) table's cost per batch as it grows, in its layout and in the one before.

A history table keeps every version, so it only grows; each batch closes the current versions
of the keys it changes with a MERGE. In the unpartitioned layout of pgcdc before session 24
every MERGE copied the whole table into new files (the closed versions too), so a batch cost
more the longer the pipeline had run. History tables are now partitioned by ``_is_current``
and a MERGE rewrites the current partition only (one row per key). Lakes made before keep
their unpartitioned tables, which the same code still writes: that is the baseline here, run
in the same process on the same batches.

A table of ``--keys`` rows (pgbench_accounts' shape) is loaded, then ``--batches`` batches of
``--updates`` random updates (4 per transaction) are written through ``pgcdc.sinks.write_table``
into a new history table and into one created unpartitioned; the time of each batch's write is
printed for the first and the last batches, with the ratio between the layouts.

    python3 bench/history.py [--keys 100000] [--updates 20000] [--batches 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from common import print_figure
from pgcdc.events import ReplicaIdentity
from pgcdc.lsn import LSN
from pgcdc.sinks import SinkKind, read_table, write_table
from pgcdc.sinks.changes import TableSpec, change_schema
from pgcdc.sinks.delta import table_schema

SCHEMA = pa.schema([("aid", pa.int32()), ("abalance", pa.int64()), ("filler", pa.string())])
SPEC = TableSpec("public", "accounts", SCHEMA, ("aid",), LSN(0x100), ReplicaIdentity.DEFAULT)
FILLER = " " * 84


def _changes(
    ids: np.ndarray, balances: np.ndarray, op: str, lsn: int, at: datetime
) -> tuple[pa.Table, int]:
    """Change rows for ``ids``, four to a transaction, from ``lsn`` on; the next LSN."""
    count = len(ids)
    lsns = lsn + 0x28 * np.arange(count, dtype=np.int64)
    commits = lsns - lsns % (4 * 0x28) + 4 * 0x28
    columns = {
        "aid": pa.array(ids, pa.int32()),
        "abalance": pa.array(balances, pa.int64()),
        "filler": pa.array([FILLER] * count, pa.string()),
        "_op": pa.array([op] * count, pa.string()),
        "_seq": pa.array(np.arange(count) % 4),
        "_lsn": pa.array(lsns),
        "_xid": pa.array(700 + lsns // (4 * 0x28)),
        "_origin": pa.nulls(count, pa.string()),
        "_unchanged": pa.array([[]] * count, pa.list_(pa.string())),
        "_old": pa.nulls(count),
        "_text": pa.nulls(count),
        "_old_text": pa.nulls(count),
        "_commit_lsn": pa.array(commits),
        "_commit_time": pa.array([at] * count, pa.timestamp("us", tz="UTC")),
    }
    schema = change_schema(SPEC)
    arrays = [columns[f.name].cast(f.type) for f in schema]  # the change columns, as written
    return pa.Table.from_arrays(arrays, schema=schema), int(lsns[-1]) + 8 * 0x28


def _layouts(work: Path) -> dict[str, str]:
    """The history table's two paths: the current layout (made by the first write) and the
    unpartitioned one of pgcdc before session 24 (created beforehand, with the same schema)."""
    probe = work / "probe"
    first, _ = _changes(np.array([1]), np.array([0]), "insert", 0x1000, datetime.now(UTC))
    write_table(probe, SPEC, first, SinkKind.HISTORY, app_id="probe", version=1)
    before = work / "unpartitioned"
    DeltaTable.create(before, table_schema(DeltaTable(probe)))
    return {"partitioned by _is_current": str(work / "partitioned"), "unpartitioned": str(before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    lsn = 0x1000
    keys = np.arange(1, args.keys + 1)
    batches = [_changes(keys, np.zeros(args.keys, np.int64), "insert", lsn, at)]
    lsn = batches[0][1]
    for _ in range(args.batches):
        ids = rng.choice(keys, args.updates, replace=False)
        changed = _changes(ids, rng.integers(-5000, 5000, args.updates), "update", lsn, at)
        at += timedelta(seconds=1)
        batches.append(changed)
        lsn = changed[1]
    print(f"{args.keys:,} keys, then {args.batches} batches of {args.updates:,} updates")
    with tempfile.TemporaryDirectory(prefix="pgcdc-bench-history-") as folder:
        seconds: dict[str, list[float]] = {}
        for layout, path in _layouts(Path(folder)).items():
            took = seconds[layout] = []
            for version, (changes, _) in enumerate(batches, 1):
                started = time.perf_counter()
                write_table(path, SPEC, changes, SinkKind.HISTORY, app_id="bench", version=version)
                took.append(time.perf_counter() - started)
            rows = read_table(path)
            print(f"{layout}: {rows.num_rows:,} versions at the end, "
                  f"{len(DeltaTable(path).file_uris())} files")  # fmt: skip
        new, old = seconds["partitioned by _is_current"], seconds["unpartitioned"]
        tail = max(1, args.batches // 5)
        picks = {"first": slice(1, 1 + tail), "last": slice(-tail, None), "all": slice(1, None)}
        for name, pick in picks.items():
            label = f"{name} {tail} batches" if name != "all" else "all batches"
            before = _mean(old[pick]) * 1000
            print_figure(f"unpartitioned: {label}, each", before, "ms")
            print_figure(f"partitioned: {label}, each", _mean(new[pick]) * 1000, "ms", before)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
