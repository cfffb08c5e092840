"""Delta Lake tables (changelog, mirror, SCD2 history) written with ``deltalake`` (delta-rs).

The input is one Arrow table of typed changes per source table (``pgcdc.sinks.changes``); see
``pgcdc.sinks.delta`` for the tables' layouts, ``pgcdc.sinks.paths`` for where they live and
``pgcdc.sinks.read`` to read them back.
"""

from pgcdc.sinks.changes import TableSpec, change_schema, normalize
from pgcdc.sinks.delta import DeltaSink, SinkKind, WriteResult, write_table
from pgcdc.sinks.paths import table_path
from pgcdc.sinks.read import read_table, to_spark

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
