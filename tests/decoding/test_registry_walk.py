"""Every vectorised kernel equals the per-value reference, for every type in the registry.

The walk starts from the registry, not from a list kept by hand: each built-in type for which
``columnar.fast_kind`` picks a kernel (text or binary format, under each Arrow option) is
decoded both ways from sample values the server can send, edge values included. A kernel
added for a type without samples here fails the walk, naming the type.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from pgcdc.decoding import arrow, columnar
from pgcdc.decoding.arrow import ArrowOptions
from pgcdc.decoding.pgtypes import BY_OID
from pgcdc.decoding.values import registry_for
from pgcdc.events import UNCHANGED_TOAST, RawValue

from .test_arrow import DOUBLE, PRECISE, STRING
from .test_columnar import always_columnar, array_text, columnar_and_per_value, one_column

__all__ = ["always_columnar"]  # the fixture: every batch here takes the columnar path

OPTIONS = {"precise": PRECISE, "double": DOUBLE, "string": STRING}
REGISTRY = registry_for(None)

# Text any type whose codec keeps the text as it is must pass through unchanged.
ANY_TEXT = [
    "",
    "a",
    "grüße ✓ 𝄞",
    "\x0b",
    "tab\there",
    'x"y',
    "back\\slash",
    "a b",
    "{}",
    "NULL",
    ",",
    "(1,2)",
]

# What the server prints for the types whose text decoder parses (edge values included).
TEXT_SAMPLES: dict[str, list[str]] = {
    "bool": ["t", "f"],
    "bytea": ["\\x", "\\x00ff", "\\xdeadbeef"],
    "int2": ["0", "-32768", "32767", "7"],
    "int4": ["0", "-2147483648", "2147483647", "42"],
    "int8": ["0", "-9223372036854775808", "9223372036854775807", "-1"],
    "oid": ["0", "4294967295", "16384"],
    "xid": ["0", "4294967295", "731"],
    "cid": ["0", "4294967295", "3"],
    "xid8": ["0", "18446744073709551615", "731"],
    "float4": ["0", "-0", "3.1415927", "1e-45", "3.4028235e+38", "NaN", "Infinity", "-Infinity"],
    "float8": [
        "0",
        "-0",
        "3.141592653589793",
        "5e-324",
        "1.7976931348623157e+308",
        "NaN",
        "Infinity",
        "-Infinity",
    ],
    "date": [
        "2024-02-29",
        "1970-01-01",
        "0001-01-01",
        "0044-03-15 BC",
        "5874897-12-31",
        "infinity",
        "-infinity",
        "10000-01-01",
    ],
    "timestamp": [
        "2024-02-29 12:34:56.789012",
        "1970-01-01 00:00:00",
        "0044-03-15 12:00:00 BC",
        "294276-12-31 23:59:59.999999",
        "infinity",
        "-infinity",
    ],
    "timestamptz": [
        "2024-01-01 00:00:00+00",
        "2024-06-30 23:59:59.5-07",
        "1900-01-01 00:00:00+05:53:28",
        "0044-03-15 12:00:00+00 BC",
        "infinity",
        "-infinity",
        "2024-01-01 05:30:00+05:30",
    ],
    "bit": ["", "0", "1", "10110"],
    "varbit": ["", "0", "1", "1011001110001111"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000"],
}


def _pack(fmt: str, values: list[Any]) -> list[bytes]:
    return [struct.pack(fmt, v) for v in values]


_UTF8 = [t.encode() for t in ANY_TEXT]
_PG_EPOCH = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970
_INT64_EDGES = [0, -1, 2**63 - 1, -(2**63), 2**63 - 10**15, -_PG_EPOCH - 10**17]
BINARY_SAMPLES: dict[str, list[bytes]] = {
    "bool": [b"\x00", b"\x01"],
    "bytea": [b"", b"\x00\xff", b"x" * 40],
    "int2": _pack(">h", [0, -(2**15), 2**15 - 1]),
    "int4": _pack(">i", [0, -(2**31), 2**31 - 1]),
    "int8": _pack(">q", [0, -(2**63), 2**63 - 1]),
    "oid": _pack(">I", [0, 2**32 - 1]),
    "xid": _pack(">I", [0, 2**32 - 1]),
    "cid": _pack(">I", [0, 2**32 - 1]),
    "xid8": _pack(">Q", [0, 2**64 - 1]),
    "float4": _pack(">f", [0.0, -0.0, 3.1415927, float("nan"), float("inf"), float("-inf")]),
    "float8": _pack(">d", [0.0, -0.0, 5e-324, float("nan"), float("inf"), float("-inf")]),
    "date": _pack(">i", [0, -1, 2**31 - 1, -(2**31), -800_000, 2_000_000]),
    "timestamp": _pack(">q", _INT64_EDGES),
    "timestamptz": _pack(">q", _INT64_EDGES),
    "uuid": [uuid.UUID(TEXT_SAMPLES["uuid"][0]).bytes, bytes(16)],
    "jsonb": [b'\x01{"a": 1}', b"\x01[]", b'\x01"\xc3\xbc"'],
}
for _name in ("text", "varchar", "bpchar", "name", "json", "xml", "enum"):
    BINARY_SAMPLES[_name] = _UTF8


def kernel_kind(oid: int, fmt: str, options: ArrowOptions) -> str:
    """The kernel ``columnar.fast_kind`` picks for a column of this type, '' for none."""
    resolved = REGISTRY.resolve(oid)
    data_type = arrow.arrow_type(oid, -1, None, options)
    element = arrow._array_element(resolved)
    temporal = options.temporal
    return columnar.fast_kind(
        resolved.name, data_type, fmt, utf8=True, temporal=temporal, element=element
    )


def kernels() -> list[tuple[int, str, str]]:
    """(type OID, format, option name) for every built-in type with a vectorised kernel."""
    return [
        (oid, fmt, option)
        for oid in sorted(BY_OID)
        for option, options in OPTIONS.items()
        for fmt in ("t", "b")
        if kernel_kind(oid, fmt, options)
    ]


def _identity_text(oid: int) -> bool:
    """The type's text decoder keeps any text as it is (so any text is a valid sample)."""
    decode = REGISTRY.codec(oid).text
    try:
        return all(decode(t) == t for t in ANY_TEXT)
    except ValueError:
        return False


def text_samples(oid: int) -> list[RawValue]:
    resolved = REGISTRY.resolve(oid)
    element = resolved.element
    if resolved.name == "array" and element is not None:
        items = ANY_TEXT if _identity_text(element.oid) else TEXT_SAMPLES[element.name]
        shaped: list[RawValue] = [array_text([*items[i:], None]) for i in range(len(items))]
        return [*shaped, "{}", "{{1,2},{3,4}}" if not _identity_text(element.oid) else "{{a},{b}}"]
    if resolved.name in TEXT_SAMPLES:
        return list(TEXT_SAMPLES[resolved.name])
    assert _identity_text(oid), f"no text samples for {BY_OID[oid].name} ({oid}): add them"
    return list(ANY_TEXT)


def binary_samples(oid: int) -> list[RawValue]:
    name = REGISTRY.resolve(oid).name
    assert name in BINARY_SAMPLES, f"no binary samples for {BY_OID[oid].name} ({oid}): add them"
    return list(BINARY_SAMPLES[name])


SAMPLES: dict[str, Callable[[int], list[RawValue]]] = {"t": text_samples, "b": binary_samples}


@pytest.mark.parametrize(
    ("type_oid", "fmt", "option"),
    kernels(),
    ids=lambda v: BY_OID[v].name if isinstance(v, int) else v,
)
def test_every_kernel_equals_the_per_value_path(type_oid: int, fmt: str, option: str) -> None:
    samples = SAMPLES[fmt](type_oid)
    # Values, NULLs and unchanged TOAST mixed, enough rows for the columnar path.
    rows: list[tuple[RawValue, ...]] = [(v,) for v in samples]
    rows += [(None,), (UNCHANGED_TOAST,), (samples[0],)] * 3
    fast, slow = columnar_and_per_value(one_column(type_oid), rows, OPTIONS[option])
    assert fast == slow


def test_the_walk_reaches_every_kind_of_kernel() -> None:
    """The registry walk is not empty and covers each kernel kind in both formats."""
    kinds = {kernel_kind(oid, fmt, OPTIONS[option]) for oid, fmt, option in kernels()}
    expected = {"identity", "uuid", "bool", "cast", "bytea_hex", "number", "bytes", "jsonb"}
    expected |= {"date", "timestamp", "timestamptz", "array:identity", "array:cast"}
    assert expected <= kinds
