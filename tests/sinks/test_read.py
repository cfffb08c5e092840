"""Reading the sinks' tables back: pyarrow, and Spark from the Delta table's file list."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.sinks import DeltaSink, SinkKind, read_table, to_spark

from .model import ITEMS_SCHEMA, Source, items_spec


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("pgcdc-sinks-test")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_to_spark_reads_the_current_snapshot(spark: Any, tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path, app_id="spark", kinds=(SinkKind.MIRROR,))
    src = Source(items_spec())
    for i in range(4):
        src.insert(id=i, name=f"n{i}", body="b", qty=i)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.delete((0,))
    src.update((1,), qty=100)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    path = sink.path(src.spec, SinkKind.MIRROR)
    frame = to_spark(spark, path)
    rows = sorted(tuple(r[c] for c in ITEMS_SCHEMA.names) for r in frame.collect())
    expected = sorted(tuple(r.values()) for r in src.rows.values())
    assert rows == expected
    arrow = read_table(path).select(ITEMS_SCHEMA.names).to_pylist()
    assert sorted(tuple(r.values()) for r in arrow) == expected


def test_to_spark_reads_a_history_table_partitioned_by_is_current(
    spark: Any, tmp_path: Path
) -> None:
    """The partition column is in no data file: both readers take it from the Delta log."""
    sink = DeltaSink(tmp_path, app_id="spark", kinds=(SinkKind.HISTORY,))
    src = Source(items_spec())
    for i in range(3):
        src.insert(id=i, name=f"n{i}", body="b", qty=i)
    src.commit()
    sink.write_batch(1, [(src.spec, src.take())])
    src.update((1,), qty=100)
    src.commit()
    sink.write_batch(2, [(src.spec, src.take())])
    path = sink.path(src.spec, SinkKind.HISTORY)
    frame = to_spark(spark, path)
    rows = sorted((r["id"], r["qty"], r["_is_current"]) for r in frame.collect())
    assert rows == [(0, 0, True), (1, 1, False), (1, 100, True), (2, 2, True)]
    assert frame.columns == read_table(path).column_names
    arrow = read_table(path).select(["id", "qty", "_is_current"]).to_pylist()
    assert sorted(tuple(r.values()) for r in arrow) == rows
