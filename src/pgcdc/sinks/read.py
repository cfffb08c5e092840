"""Read the sinks' Delta tables back, with pyarrow or Spark.

``read_table`` reads a local table's Parquet files with pyarrow directly: deltalake's own
``to_pyarrow_dataset`` turns file statistics into Python ``date`` values, which fail for BC and
post-9999 dates (PostgreSQL has both). Tables with ``storage_options`` (object stores) still go
through ``to_pyarrow_dataset``.

``to_spark`` prefers delta-spark (``spark.read.format("delta")``) when the session has it, as
that honours every Delta feature. Without it, it reads the Parquet files of the table's current
snapshot (``DeltaTable.file_uris()``): correct for the tables the sinks write (no deletion
vectors, no column mapping), but a snapshot fixed at call time, not a live Delta source.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from pgcdc.sinks.schema import normalize_read_type


def dataset(table: DeltaTable, storage_options: dict[str, str] | None = None) -> ds.Dataset:
    """A pyarrow dataset of a Delta table's snapshot; Parquet files read directly when local
    (the sinks write neither deletion vectors nor column mapping nor partitions)."""
    uris = table.file_uris()
    local = storage_options is None and all(u.startswith(("/", "file:")) for u in uris)
    if not local:
        return table.to_pyarrow_dataset()
    delta = pa.schema(table.schema().to_arrow())
    schema = pa.schema([pa.field(f.name, normalize_read_type(f.type)) for f in delta])
    paths = [u.removeprefix("file://") for u in uris]
    # Files written before a column was added lack it: the dataset reads it as null.
    return ds.dataset(paths, schema=schema, format="parquet")


def read_table(
    path: str | Path, *, version: int | None = None, storage_options: dict[str, str] | None = None
) -> pa.Table:
    """A Delta table's current (or ``version``) snapshot as an Arrow table, in the written types."""
    table = DeltaTable(str(path), version=version, storage_options=storage_options)
    data = dataset(table, storage_options).to_table()
    schema = pa.schema([pa.field(f.name, normalize_read_type(f.type)) for f in data.schema])
    return data.cast(schema)


def _has_delta_spark(spark: Any) -> bool:
    if importlib.util.find_spec("delta") is None:
        return False
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return "DeltaSparkSessionExtension" in extensions


def to_spark(spark: Any, path: str | Path, *, storage_options: dict[str, str] | None = None) -> Any:
    """A Spark DataFrame of a Delta table (``spark`` is a ``pyspark.sql.SparkSession``)."""
    if _has_delta_spark(spark):
        return spark.read.format("delta").load(str(path))
    table = DeltaTable(str(path), storage_options=storage_options)
    files = table.file_uris()
    schema = pa.schema(table.schema().to_arrow())
    if not files:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(schema))
    # Files written before a column was added lack it; mergeSchema fills those with null.
    return spark.read.option("mergeSchema", "true").parquet(*files)
