"""Exact row identities for the mirror and history tables.

A row is matched by ``_pgcdc_key``: one binary value encoding every replica-identity column of the
row, never its possibly-null typed value. Each column contributes ``N`` (SQL NULL), ``T<len>:``
and its PostgreSQL text form (a value only the ``_text`` map holds: date ``infinity``, numeric
``NaN``...) or ``V<len>:`` and a canonical form of its typed value; the length prefixes make the
concatenation unambiguous. Canonical typed forms: integers and decimals as their digits with
trailing fraction zeros dropped (so int -> decimal widening and 1.50 = 1.500 agree), floats as
Arrow prints them (NaN equals NaN, as PostgreSQL's float equality has it), dates and timestamps
as their integer day or microsecond counts (no Python ``date``: every PostgreSQL value fits),
lists and structs element by element, each element framed the same way.

Keyless REPLICA IDENTITY FULL tables may hold identical rows, so their mirror and history also
carry ``_pgcdc_copy``: the copy number of a row among the identical ones (1, 2, ...). An INSERT of a
row the table already holds n times is copy n+1; a DELETE (or the old row of an UPDATE) removes
the highest copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.sinks import changes as c
from pgcdc.sinks.schema import UnsupportedType

KEY = "_pgcdc_key"
OLD_KEY = "_pgcdc_old_key"
COPY = "_pgcdc_copy"
OLD_COPY = "_pgcdc_old_copy"
KEY_TYPE = pa.binary()
COPY_TYPE = pa.int64()

_NULL = b"N"


def counts_copies(spec: c.TableSpec) -> bool:
    """Whether the table's rows may repeat exactly (keyless REPLICA IDENTITY FULL): its mirror
    and history then number the copies of a row."""
    return spec.old_is_full_row and set(spec.key_columns) == set(spec.schema.names)


def identity_columns(spec: c.TableSpec) -> tuple[str, ...]:
    """The columns that identify a row of the mirror or history."""
    return (KEY, COPY) if counts_copies(spec) else (KEY,)


def _binary(array: pa.Array) -> pa.Array:
    return array if array.type == KEY_TYPE else array.cast(KEY_TYPE)


def _frame(tag: bytes, values: pa.Array) -> pa.Array:
    """``tag``, the byte length, ``:`` and the value; null stays null."""
    values = _binary(values)
    lengths = pc.binary_length(values).cast(pa.string()).cast(KEY_TYPE)
    return pc.binary_join_element_wise(pa.scalar(tag, KEY_TYPE), lengths, b":", values, b"")


def _digits(array: pa.Array) -> pa.Array:
    text = array.cast(pa.string())
    if pa.types.is_decimal(array.type) and array.type.scale > 0:
        text = pc.replace_substring_regex(text, r"\.?0+$", "")
    return text


def _canonical(array: pa.Array) -> pa.Array:
    """A canonical binary form of each typed value (null where the value is null)."""
    t = array.type
    if pa.types.is_integer(t) or pa.types.is_decimal(t):
        return _binary(_digits(array))
    if pa.types.is_floating(t) or pa.types.is_boolean(t):
        return _binary(array.cast(pa.string()))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return _binary(array)
    if pa.types.is_date32(t):
        return _binary(array.cast(pa.int32()).cast(pa.string()))
    if pa.types.is_timestamp(t):
        return _binary(array.cast(pa.int64()).cast(pa.string()))
    if pa.types.is_map(t):
        entries = pa.StructArray.from_arrays([array.keys, array.items], names=["key", "value"])
        array = pa.ListArray.from_arrays(array.offsets, entries, mask=array.is_null())
        t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = pc.subtract(array.offsets, array.offsets[0])  # a slice's values start at 0
        inner = framed(array.flatten())
        lists = pa.ListArray.from_arrays(offsets.cast(pa.int32()), inner, mask=array.is_null())
        return pc.binary_join(lists, b"")
    if pa.types.is_struct(t):
        parts = [framed(child) for child in array.flatten()]
        joined = pc.binary_join_element_wise(*parts, b"") if parts else pa.nulls(len(array))
        return pc.if_else(array.is_valid(), _binary(joined), pa.scalar(None, KEY_TYPE))
    raise UnsupportedType(f"a key column of type {t} has no key encoding")


def framed(array: pa.Array, text: pa.Array | None = None) -> pa.Array:
    """Each value framed (``N``, ``T<len>:text`` or ``V<len>:value``); never null."""
    typed = pc.fill_null(_frame(b"V", _canonical(array)), pa.scalar(_NULL, KEY_TYPE))
    if text is None or text.null_count == len(text):
        return typed
    return pc.if_else(text.is_valid(), _frame(b"T", text), typed)


def named(column: str, framed_values: pa.Array) -> pa.Array:
    """A REPLICA IDENTITY FULL key's part: the column's name and framed value, and nothing for
    SQL NULL. A whole-row key then stays what it was when a column is added (null in every row
    written before) or a column that held null is dropped; self-delimiting, so still exact."""
    name = column.encode()
    prefix = b"C" + str(len(name)).encode() + b":" + name
    tagged = pc.binary_join_element_wise(pa.scalar(prefix, KEY_TYPE), framed_values, b"")
    is_null = pc.equal(framed_values, pa.scalar(_NULL, KEY_TYPE))
    return pc.if_else(is_null, pa.scalar(b"", KEY_TYPE), tagged)


def text_of(text_map: pa.Array, column: str) -> pa.Array | None:
    """The ``_text`` entries for ``column`` (null where the typed value holds it)."""
    if text_map.null_count == len(text_map):
        return None
    found = pc.map_lookup(text_map, pa.scalar(column, pa.string()), "first")
    return None if found.null_count == len(found) else found


def encode_framed(parts: Sequence[pa.Array]) -> pa.Array:
    """The ``_pgcdc_key`` of each row from its key columns' ``framed`` values."""
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, b"")


def encode(columns: Sequence[pa.Array], texts: Sequence[pa.Array | None]) -> pa.Array:
    """The ``_pgcdc_key`` of each row from its key columns' values and text forms."""
    return encode_framed([framed(a, t) for a, t in zip(columns, texts, strict=True)])
