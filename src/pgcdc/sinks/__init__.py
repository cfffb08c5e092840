"""Delta Lake tables (changelog, mirror, SCD2 history) written with ``deltalake`` (delta-rs).

The input is one Arrow table of typed changes per source table (``pgcdc.sinks.changes``); see
``pgcdc.sinks.delta`` for the tables' layouts, ``pgcdc.sinks.paths`` for where they live and
``pgcdc.sinks.read`` to read them back.

The names below are imported on first use: the pipeline's receiver process needs
``SinkKind`` (``pgcdc.sinks.kinds``) without deltalake and pyarrow's dataset code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pgcdc.sinks.kinds import SinkKind

if TYPE_CHECKING:
    from pgcdc.sinks.changes import TableSpec, change_schema, normalize
    from pgcdc.sinks.delta import DeltaSink, WriteResult, write_table
    from pgcdc.sinks.paths import table_path
    from pgcdc.sinks.read import read_table, to_spark

_HOMES = {
    "TableSpec": "changes",
    "change_schema": "changes",
    "normalize": "changes",
    "DeltaSink": "delta",
    "WriteResult": "delta",
    "write_table": "delta",
    "table_path": "paths",
    "read_table": "read",
    "to_spark": "read",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "DeltaSink",
    "SinkKind",
    "TableSpec",
    "WriteResult",
    "change_schema",
    "normalize",
    "read_table",
    "table_path",
    "to_spark",
    "write_table",
]
