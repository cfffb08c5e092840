"""Typed lake values back to PostgreSQL input text, one small converter per Arrow type.

The oracle compares values in PostgreSQL's own text form: lake values are turned into text
PostgreSQL accepts as input for the column's type (exactly, never rounded), loaded into a
scratch table of the same column types, and read back with ``::text``; the subscriber's values
are read with ``::text`` in the same session. Only these converters stand between the lake and
PostgreSQL, and each keeps every bit of the Arrow value (``test_texts.py`` round-trips them).

Types as the Delta tables hold them (``pgcdc.sinks.schema``): times of day are int64
microseconds, intervals a struct of months, days and nanoseconds; dates and timestamps are
converted through their integer values, so years before 1 and after 9999 need no ``datetime``.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Texts = list[str | None]

US_PER_DAY = 86_400_000_000


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of ``days`` since 1970-01-01; year 0 is 1 BC."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return year, month, day


def date_text(days: int) -> str:
    year, month, day = civil_from_days(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


def time_text(micros: int) -> str:
    """HH:MM:SS.ffffff; hours may pass 24 (24:00:00, interval hours)."""
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}"


def timestamp_text(micros: int, utc: bool) -> str:
    days, rest = divmod(micros, US_PER_DAY)
    year, month, day = civil_from_days(days)
    shown = 1 - year if year <= 0 else year
    text = f"{shown:04d}-{month:02d}-{day:02d} {time_text(rest)}"
    if utc:
        text += "+00"
    return text + (" BC" if year <= 0 else "")


def interval_text(months: int, days: int, nanos: int) -> str:
    micros, rest = divmod(nanos, 1000)
    if rest:
        raise ValueError(f"interval with {nanos} ns is not whole microseconds")
    sign = "-" if micros < 0 else "+"
    return f"{months} mons {days} days {sign}{time_text(abs(micros))}"


def float_text(value: float) -> str:
    return repr(value)  # nan, inf, -inf, -0.0 and the shortest exact digits: float8in reads them


def decimal_text(value: Decimal) -> str:
    return format(value, "f")  # never exponents: money_in does not read them


def char_text(value: str) -> str:
    """The "char" type: the lake holds a byte >= 0x80 as chr(byte); charin reads it as \\ooo."""
    if len(value) == 1 and ord(value) >= 0x80:
        return f"\\{ord(value):03o}"
    return value


def _quote_element(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def texts(array: pa.Array, pg_type: str) -> Texts:
    """PostgreSQL input text for each value of ``array`` (None for null). ``pg_type`` is the
    scalar base type name (the element type for arrays, the base type for domains)."""
    t = array.type
    valid = array.is_valid().to_pylist()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = texts(array.flatten(), pg_type)
        offsets = array.offsets.to_pylist()
        first = offsets[0]
        out: Texts = []
        for i, ok in enumerate(valid):
            if not ok:
                out.append(None)
                continue
            items = inner[offsets[i] - first : offsets[i + 1] - first]
            out.append(
                "{" + ",".join("NULL" if v is None else _quote_element(v) for v in items) + "}"
            )
        return out
    convert: Callable[[Any], str]
    if pa.types.is_boolean(t):
        values = array.to_pylist()
        convert = lambda v: "t" if v else "f"  # noqa: E731
    elif pa.types.is_integer(t):
        values = array.to_pylist()
        convert = time_text if pg_type == "time" else str
    elif pa.types.is_floating(t):
        values = array.to_pylist()
        convert = float_text
    elif pa.types.is_decimal(t):
        values = array.to_pylist()
        convert = decimal_text
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        values = array.to_pylist()
        convert = char_text if pg_type == "char" else str
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values = array.to_pylist()
        convert = lambda v: "\\x" + v.hex()  # noqa: E731
    elif pa.types.is_date32(t):
        values = pc.cast(array, pa.int32()).to_pylist()
        convert = date_text
    elif pa.types.is_timestamp(t):
        if t.unit != "us":
            raise TypeError(f"timestamp unit {t.unit}: the sinks write microseconds")
        utc = t.tz is not None
        values = array.view(pa.int64()).to_pylist()
        convert = lambda v: timestamp_text(v, utc)  # noqa: E731
    elif pa.types.is_struct(t) and {f.name for f in t} == {"months", "days", "nanoseconds"}:
        values = array.to_pylist()
        convert = lambda v: interval_text(v["months"], v["days"], v["nanoseconds"])  # noqa: E731
    else:
        raise TypeError(f"no PostgreSQL text converter for Arrow type {t} ({pg_type})")
    return [
        convert(v) if ok and v is not None else None for v, ok in zip(values, valid, strict=True)
    ]
