"""How pgcdc writes the data files of its Delta tables: the snapshot's staged files and each
micro-batch's appends and MERGEs.

Pages are Snappy-compressed and dictionary-encoded, but for the columns whose values do not
repeat. On a column of few values (a status, a country, a change's operation) a dictionary
makes the pages several times smaller, and it still pays on one of thousands (a balance);
on a column of distinct values (a key, an LSN, most timestamps and amounts) the writer hashes
every value only to fall back once the dictionary outgrows its page, or keeps a dictionary as
large as the values, and the file is larger than with plain pages. Which columns repeat is told
by the first rows written. Statistics stay as delta-rs writes them: the add actions carry
them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, WriterProperties

_PLAIN = ColumnProperties(dictionary_enabled=False)
_DICTIONARY = ColumnProperties(dictionary_enabled=True)
# The rows looked at, and the fewest that say anything: a handful of rows are all distinct.
_SAMPLE_ROWS = 4096
_LEAST_SAMPLE = 512


def writer_properties(rows: pa.Table) -> WriterProperties:
    """Properties for writing ``rows``: plain pages for a column when at least 90% of its
    first ``_SAMPLE_ROWS`` values are distinct, a dictionary otherwise (and for all columns of
    fewer than ``_LEAST_SAMPLE`` rows, nested ones, and those Arrow cannot count)."""
    sample = rows.slice(0, _SAMPLE_ROWS)
    plain = {}
    if sample.num_rows >= _LEAST_SAMPLE:
        for name, column in zip(sample.column_names, sample.columns, strict=True):
            if pa.types.is_nested(column.type):
                continue
            try:
                distinct = pc.count_distinct(column).as_py()
            except pa.ArrowNotImplementedError:  # a type it has no kernel for (null, views)
                continue
            if distinct * 10 >= len(column) * 9:
                plain[name] = _PLAIN
    return WriterProperties(
        compression="SNAPPY",
        default_column_properties=_DICTIONARY,
        column_properties=plain or None,
    )


__all__ = ["writer_properties"]
