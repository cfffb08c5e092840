"""Cheap size estimates for buffered events, to decide when to spill.

The estimate follows the payload: the lengths of the column values as the server sent them plus
a fixed overhead per value and per event. It never walks object graphs (``sys.getsizeof`` deep
sizing would cost more than the buffering it guards); callers that know the exact payload
length pass it to ``TransactionAssembler.feed`` instead.
"""

from __future__ import annotations

from pgcdc.events import (
    Delete,
    EncodedRow,
    Event,
    Insert,
    Message,
    Relation,
    Row,
    Truncate,
    Update,
)

EVENT_OVERHEAD = 64
VALUE_OVERHEAD = 8
COLUMN_OVERHEAD = 32


def row_size(row: Row) -> int:
    if type(row) is EncodedRow:  # its wire bytes, without decoding them
        return VALUE_OVERHEAD * len(row) + len(row.data)
    size = VALUE_OVERHEAD * len(row)
    for value in row:
        if type(value) is str or type(value) is bytes:
            size += len(value)
    return size


def estimate_size(event: Event) -> int:
    """Approximate bytes an event holds, from its payload lengths."""
    if type(event) is Insert:
        return EVENT_OVERHEAD + row_size(event.new)
    if type(event) is Update:
        old = event.old
        return EVENT_OVERHEAD + row_size(event.new) + (row_size(old) if old is not None else 0)
    if type(event) is Delete:
        return EVENT_OVERHEAD + row_size(event.old)
    if type(event) is Message:
        return EVENT_OVERHEAD + len(event.prefix) + len(event.content)
    if type(event) is Truncate:
        return EVENT_OVERHEAD + VALUE_OVERHEAD * len(event.tables)
    if type(event) is Relation:
        return EVENT_OVERHEAD + COLUMN_OVERHEAD * len(event.table.columns)
    return EVENT_OVERHEAD
