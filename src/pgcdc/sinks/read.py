"""Read the sinks' Delta tables back, with pyarrow or Spark.

``read_table`` reads a local table's Parquet files with pyarrow directly: deltalake's own
``to_pyarrow_dataset`` turns file statistics into Python ``date`` values, which fail for BC and
post-9999 dates (PostgreSQL has both). Tables with ``storage_options`` (object stores) still go
through ``to_pyarrow_dataset``.

``to_spark`` prefers delta-spark (``spark.read.format("delta")``) when the session has it, as
that honours every Delta feature. Without it, it reads the Parquet files of the table's current
snapshot (``DeltaTable.file_uris()``): correct for the tables the sinks write (no deletion
vectors, no column mapping), but a snapshot fixed at call time, not a live Delta source.

A partitioned table's files lack the partition columns (history tables are partitioned by
``_is_current``): both readers take each file's values from its add action in the Delta log,
never from the directory names.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

from pgcdc.errors import SinkError
from pgcdc.sinks.schema import normalize_read_type


def dataset(table: DeltaTable, storage_options: dict[str, str] | None = None) -> ds.Dataset:
    """A pyarrow dataset of a Delta table's snapshot; Parquet files read directly when local
    (the sinks write neither deletion vectors nor column mapping)."""
    uris = table.file_uris()
    local = storage_options is None and all(u.startswith(("/", "file:")) for u in uris)
    if not local:
        return table.to_pyarrow_dataset()
    delta = pa.schema(table.schema().to_arrow())
    schema = pa.schema([pa.field(f.name, normalize_read_type(f.type)) for f in delta])
    paths = [u.removeprefix("file://") for u in uris]
    # Files written before a column was added lack it: the dataset reads it as null.
    if not table.metadata().partition_columns:
        return ds.dataset(paths, schema=schema, format="parquet")
    return ds.FileSystemDataset.from_paths(
        paths,
        schema=schema,
        format=ds.ParquetFileFormat(),
        filesystem=pafs.LocalFileSystem(),
        partitions=[_partition_expression(values) for values in partition_values(table)],
    )


def partition_values(table: DeltaTable) -> list[dict[str, Any]]:
    """Each file's partition values, typed, in ``file_uris()`` order (both list the
    snapshot's add actions); empty for an unpartitioned table."""
    columns = list(table.metadata().partition_columns)
    uris = table.file_uris()
    if not columns:
        return [{} for _ in uris]
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = [unquote(p) for p in actions.column("path").to_pylist()]
    if len(paths) != len(uris) or not all(
        unquote(u).endswith(p) for u, p in zip(uris, paths, strict=True)
    ):
        raise SinkError(
            f"{table.table_uri}: its files and its add actions are not listed alike by "
            "deltalake, so the partition values of its files are unknown; report this as a bug"
        )
    values = [actions.column(f"partition.{name}").to_pylist() for name in columns]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)]


def _partition_expression(values: dict[str, Any]) -> pc.Expression:
    """What a file's rows hold in the partition columns, as the dataset fills them in."""
    terms = [pc.field(n).is_null() if v is None else pc.field(n) == v for n, v in values.items()]
    expression = terms[0]
    for term in terms[1:]:
        expression = expression & term
    return expression


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
    if not table.metadata().partition_columns:
        return spark.read.option("mergeSchema", "true").parquet(*files)
    from pyspark.sql.functions import lit
    from pyspark.sql.pandas.types import from_arrow_type

    groups: dict[tuple[tuple[str, Any], ...], list[str]] = {}
    for uri, values in zip(files, partition_values(table), strict=True):
        groups.setdefault(tuple(values.items()), []).append(uri)
    parts = []
    for group, uris in groups.items():
        part = spark.read.option("mergeSchema", "true").parquet(*uris)
        for name, value in group:
            part = part.withColumn(name, lit(value).cast(from_arrow_type(schema.field(name).type)))
        parts.append(part)
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part, allowMissingColumns=True)
    return frame.select(*schema.names)
