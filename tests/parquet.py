"""What the tests read from the Parquet files pgcdc writes."""

from __future__ import annotations

import pyarrow.parquet as pq


def dictionary_columns(*files: str) -> set[str]:
    """The columns (leaf paths) dictionary-encoded in any row group of ``files``."""
    found: set[str] = set()
    for file in files:
        meta = pq.ParquetFile(file).metadata
        for group in range(meta.num_row_groups):
            for i in range(meta.num_columns):
                column = meta.row_group(group).column(i)
                if "RLE_DICTIONARY" in column.encodings:
                    found.add(column.path_in_schema)
    return found
