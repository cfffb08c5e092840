"""Data files written in one place and committed in another: how an initial snapshot copied by
many Spark tasks appears in each Delta table at once.

A task writes its rows with delta-rs into a throwaway Delta table nested in the target table's
directory (``<table>/pgcdc-snapshot/<name>``), so the data files are exactly what a normal write
makes (types, statistics), then reads that table's one commit for the files' add actions, with
paths made relative to the target, and deletes the throwaway log. The driver commits every
task's add actions of a table in one transaction (``commit``). Files of a task whose result
never reaches a commit (a failed attempt, a crashed driver) are referenced by nothing: a Delta
VACUUM removes them. The directory name has no leading underscore, as VACUUM skips those.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from pgcdc.errors import SinkError
from pgcdc.sinks.parquet import writer_properties
from pgcdc.sinks.schema import align
from pgcdc.storage import StorageOptions, filesystem

STAGING_DIRECTORY = "pgcdc-snapshot"
_FIRST_COMMIT = "_delta_log/" + "0" * 20 + ".json"


def stage(
    table_path: str,
    rows: pa.Table,
    schema: pa.Schema,
    storage: StorageOptions,
    *,
    partition_by: Sequence[str],
) -> list[dict[str, Any]]:
    """Write ``rows`` (aligned to the target's ``schema``) as data files of the Delta table at
    ``table_path``, partitioned as it is (``partition_by``), without committing them; returns
    their add actions (the Delta log's ``add`` objects, with their partition values). Each call
    writes under a name of its own, so a retried task never meets an earlier attempt's files."""
    if rows.num_rows == 0:
        return []
    name = uuid.uuid4().hex
    relative = f"{STAGING_DIRECTORY}/{name}"
    staging = f"{table_path.rstrip('/')}/{relative}"
    aligned = align(rows, schema)
    write_deltalake(
        staging,
        aligned,
        mode="error",
        partition_by=list(partition_by) or None,
        storage_options=storage.delta(),
        writer_properties=writer_properties(aligned),
    )
    fs, path = filesystem(staging, storage or None)
    with fs.open_input_stream(f"{path}/{_FIRST_COMMIT}") as log:
        lines = log.read().decode().splitlines()
    adds = [json.loads(line)["add"] for line in lines if line.startswith('{"add"')]
    if not adds or sum(int(json.loads(a["stats"])["numRecords"]) for a in adds) != rows.num_rows:
        raise SinkError(
            f"{staging}: delta-rs's commit does not list the {rows.num_rows} rows just written "
            "(an unexpected Delta log layout); report this as a bug"
        )
    fs.delete_dir(f"{path}/_delta_log")
    return [{**add, "path": f"{relative}/{add['path']}"} for add in adds]


def commit(
    table_path: str,
    adds: Sequence[dict[str, Any]],
    *,
    replace: bool,
    app_id: str,
    version: int,
    storage: StorageOptions,
) -> None:
    """Add ``adds`` (from ``stage``) to the table in one commit recording (``app_id``,
    ``version``); ``replace``: the commit also removes every file the table held."""
    table = DeltaTable(table_path, storage_options=storage.delta())
    partition_by = list(table.metadata().partition_columns)
    for add in adds:
        # A file without its partition values would read back null there (delta-rs takes it).
        if sorted(add.get("partitionValues") or {}) != sorted(partition_by):
            raise SinkError(
                f"{table_path}: staged file {add['path']} has partition values "
                f"{add.get('partitionValues')} but the table is partitioned by {partition_by}; "
                "report this as a bug"
            )
    actions: list[AddAction | RemoveAction] = [
        AddAction(
            path=add["path"],
            size=int(add["size"]),
            partition_values=add.get("partitionValues") or {},
            modification_time=int(add["modificationTime"]),
            data_change=True,
            stats=add.get("stats") or "",
        )
        for add in adds
    ]
    table.create_write_transaction(
        actions,
        mode="overwrite" if replace else "append",
        schema=table.schema(),
        partition_by=partition_by or None,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )


__all__ = ["STAGING_DIRECTORY", "commit", "stage"]
