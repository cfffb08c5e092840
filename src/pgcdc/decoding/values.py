"""Column values, text and binary, to Python: one codec per PostgreSQL type.

Decoders keep values as the server sent them (``str`` text, ``bytes`` binary); this module types
them. Codecs are pure functions. ``row_to_python`` resolves a table's converters once and caches
them, because it runs for every row.

Text input must use the output settings pgcdc's connections set: ``DateStyle=ISO``,
``IntervalStyle=postgres`` (``iso_8601`` is also read) and a UTF-8 client encoding.

Lossless choices (see docs/types.md): values Python's ``datetime`` cannot hold (BC, after year
9999, +/-infinity, ``24:00:00``) become ``PgDate``/``PgTimestamp``/``PgTime``; intervals become
``Interval`` (months, days and microseconds kept apart); arrays with lower bounds other than 1
become ``BoundedList``; json/jsonb stay JSON text.
"""

from __future__ import annotations

import ipaddress
import math
import re
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, TypeAlias

from pgcdc.decoding.pgtypes import BY_OID, TypeInfo
from pgcdc.decoding.textforms import (
    GEOMETRIC,
    composite_binary,
    float_text,
    money_text,
    multirange_binary,
    range_binary,
)
from pgcdc.errors import DecodeError
from pgcdc.events import UNCHANGED_TOAST, Column, RawValue, Table, Unchanged
from pgcdc.lsn import LSN
from pgcdc.pgtime import from_micros

TextDecoder: TypeAlias = Callable[[str], Any]
BinaryDecoder: TypeAlias = Callable[[bytes], Any]

# PostgreSQL counts dates and timestamps from 2000-01-01.
_PG_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()
_PG_EPOCH = datetime(2000, 1, 1)
_DAY_US = 86_400_000_000
DATE_POS_INFINITY = 2**31 - 1
DATE_NEG_INFINITY = -(2**31)
TIMESTAMP_POS_INFINITY = 2**63 - 1
TIMESTAMP_NEG_INFINITY = -(2**63)
# Days from 2000-01-01 to 0001-01-01 and to 9999-12-31: the span Python's date can hold.
_PY_MIN_DAYS = 1 - _PG_EPOCH_ORDINAL
_PY_MAX_DAYS = date(9999, 12, 31).toordinal() - _PG_EPOCH_ORDINAL
_PY_MIN_US = _PY_MIN_DAYS * _DAY_US
_PY_MAX_US = (_PY_MAX_DAYS + 1) * _DAY_US - 1


# --- values the standard library cannot hold ---------------------------------------------------


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 2000-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468 - 10957


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of ``_days_from_civil``: (astronomical year, month, day)."""
    z = days + 10957 + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _format_date(days: int) -> str:
    year, month, day = _civil_from_days(days)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


def _format_time(micros: int) -> str:
    seconds, frac = divmod(micros, 1_000_000)
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{hours:02d}:{minute:02d}:{sec:02d}"
    return text + f".{frac:06d}".rstrip("0") if frac else text


def _format_offset(offset_seconds: int) -> str:
    sign = "-" if offset_seconds < 0 else "+"
    minutes, sec = divmod(abs(offset_seconds), 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours:02d}"
    if minute or sec:
        text += f":{minute:02d}"
    if sec:
        text += f":{sec:02d}"
    return text


@dataclass(frozen=True, slots=True, order=True)
class PgDate:
    """A date Python's ``date`` cannot hold (BC, after 9999, +/-infinity), kept exactly.

    ``days`` counts from 2000-01-01 as PostgreSQL stores it; +/-infinity are 2**31-1 / -2**31.
    """

    days: int

    @property
    def is_infinite(self) -> bool:
        return self.days in (DATE_POS_INFINITY, DATE_NEG_INFINITY)

    def __str__(self) -> str:
        if self.days == DATE_POS_INFINITY:
            return "infinity"
        if self.days == DATE_NEG_INFINITY:
            return "-infinity"
        return _format_date(self.days)


@dataclass(frozen=True, slots=True, order=True)
class PgTimestamp:
    """A timestamp Python's ``datetime`` cannot hold (BC, after 9999, +/-infinity), exactly.

    ``micros`` counts from 2000-01-01 00:00 (UTC when ``with_tz``), as PostgreSQL stores it;
    +/-infinity are 2**63-1 / -2**63.
    """

    micros: int
    with_tz: bool = False

    @property
    def is_infinite(self) -> bool:
        return self.micros in (TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY)

    def __str__(self) -> str:
        if self.micros == TIMESTAMP_POS_INFINITY:
            return "infinity"
        if self.micros == TIMESTAMP_NEG_INFINITY:
            return "-infinity"
        days, micros = divmod(self.micros, _DAY_US)
        text = _format_date(days)
        bc = text.endswith(" BC")
        text = f"{text[:-3] if bc else text} {_format_time(micros)}"
        if self.with_tz:
            text += "+00"
        return text + " BC" if bc else text


@dataclass(frozen=True, slots=True, order=True)
class PgTime:
    """``24:00:00`` (which PostgreSQL allows and ``datetime.time`` does not), kept exactly.

    ``offset_seconds`` is the UTC offset of a timetz (east positive), None for time.
    """

    micros: int
    offset_seconds: int | None = None

    def __str__(self) -> str:
        text = _format_time(self.micros)
        if self.offset_seconds is None:
            return text
        return text + _format_offset(self.offset_seconds)


_INT32_MAX, _INT32_MIN = 2**31 - 1, -(2**31)
_INT64_MAX, _INT64_MIN = 2**63 - 1, -(2**63)


@dataclass(frozen=True, slots=True)
class Interval:
    """A PostgreSQL interval: months, days and microseconds are independent, as in the server.

    ``timedelta`` cannot hold months (a month is not a fixed number of days), so converting to
    it is explicit and lossy (``as_timedelta``). PostgreSQL 17's +/-infinity are all-max/min.
    """

    months: int = 0
    days: int = 0
    microseconds: int = 0

    @property
    def is_infinite(self) -> bool:
        return (self.months, self.days, self.microseconds) in (
            (_INT32_MAX, _INT32_MAX, _INT64_MAX),
            (_INT32_MIN, _INT32_MIN, _INT64_MIN),
        )

    def as_timedelta(self) -> timedelta:
        """A timedelta counting a year as 365 days and other months as 30, as psycopg does;
        lossy, because months have no fixed length."""
        years, months = divmod(abs(self.months), 12)
        month_days = (365 * years + 30 * months) * (-1 if self.months < 0 else 1)
        return timedelta(days=month_days + self.days, microseconds=self.microseconds)

    def __str__(self) -> str:
        """The IntervalStyle=postgres text form, as interval_out writes it: a part after a
        negative one is signed, and only 1 is singular ("-1 days")."""
        if self.is_infinite:
            return "infinity" if self.months > 0 else "-infinity"
        sign = -1 if self.months < 0 else 1
        years, months = divmod(abs(self.months), 12)
        parts: list[str] = []
        after_negative = False
        for value, unit in ((sign * years, "year"), (sign * months, "mon"), (self.days, "day")):
            if value:
                plus = "+" if after_negative and value > 0 else ""
                parts.append(f"{plus}{value} {unit}{'s' if value != 1 else ''}")
                after_negative = value < 0
        if self.microseconds or not parts:
            clock = _format_time(abs(self.microseconds))
            if self.microseconds < 0:
                clock = "-" + clock
            elif after_negative:
                clock = "+" + clock
            parts.append(clock)
        return " ".join(parts)


class BoundedList(list[Any]):
    """An array whose lower bounds are not all 1 (``'[0:1]={a,b}'``): a list that remembers them.

    ``lower_bounds`` has one entry per dimension, outermost first.
    """

    lower_bounds: tuple[int, ...]

    def __init__(self, items: Sequence[Any], lower_bounds: tuple[int, ...]) -> None:
        super().__init__(items)
        self.lower_bounds = lower_bounds

    def __repr__(self) -> str:
        return f"BoundedList({list(self)!r}, lower_bounds={self.lower_bounds!r})"


# --- scalar codecs -----------------------------------------------------------------------------


def _fail(reason: str) -> ValueError:
    return ValueError(reason)


def _bool_text(text: str) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise _fail("expected 't' or 'f'")


def _bool_binary(data: bytes) -> bool:
    if data == b"\x01":
        return True
    if data == b"\x00":
        return False
    raise _fail("expected one byte, 0 or 1")


_INT_RE = re.compile(r"\s*[+-]?\d+\s*\Z")


def _int_text(text: str) -> int:
    if not _INT_RE.match(text):
        raise _fail("not an integer")
    return int(text)


def _struct_binary(fmt: str) -> BinaryDecoder:
    unpack = struct.Struct(fmt).unpack
    size = struct.calcsize(fmt)

    def decode(data: bytes) -> Any:
        if len(data) != size:
            raise _fail(f"expected {size} bytes, got {len(data)}")
        return unpack(data)[0]

    return decode


def _float_text(text: str) -> float:
    return float(text)


_float4_unpack = struct.Struct(">f").unpack
_float4_pack = struct.Struct(">f").pack


def _float4_binary(data: bytes) -> float:
    """The float4 as the shortest decimal that rounds back to it, as float4out prints it, so
    text and binary give the same Python float."""
    if len(data) != 4:
        raise _fail(f"expected 4 bytes, got {len(data)}")
    value: float = _float4_unpack(data)[0]
    if math.isnan(value) or value in (float("inf"), float("-inf")):
        return value
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        try:
            if _float4_pack(candidate) == data:
                return candidate
        except OverflowError:  # rounded past the largest float4
            continue
    return value


_NUMERIC_TEXT_RE = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*\Z")


def _numeric_text(text: str) -> Decimal:
    if not _NUMERIC_TEXT_RE.match(text) and text not in ("NaN", "Infinity", "-Infinity"):
        raise _fail("not a numeric")
    return Decimal(text)


_NUMERIC_SPECIAL = {
    0xC000: Decimal("NaN"),
    0xD000: Decimal("Infinity"),
    0xF000: Decimal("-Infinity"),
}
_numeric_header = struct.Struct(">hhHh").unpack_from


def _numeric_binary(data: bytes) -> Decimal:
    """numeric_send: ndigits, weight, sign, dscale, then base-10000 digits."""
    if len(data) < 8:
        raise _fail("shorter than the 8-byte numeric header")
    ndigits, weight, sign, dscale = _numeric_header(data)
    if sign in _NUMERIC_SPECIAL:
        return _NUMERIC_SPECIAL[sign]
    if sign not in (0, 0x4000) or ndigits < 0 or dscale < 0 or len(data) != 8 + 2 * ndigits:
        raise _fail("inconsistent numeric header")
    digits = struct.unpack_from(f">{ndigits}H", data, 8)
    if any(d > 9999 for d in digits):
        raise _fail("numeric digit above 9999")
    text = "".join(f"{d:04d}" for d in digits) or "0"
    exponent = (weight + 1 - ndigits) * 4
    # Shift to exactly dscale fraction digits, as numeric_out prints it.
    if exponent > -dscale:
        text += "0" * (exponent + dscale)
    elif exponent < -dscale:
        cut = -dscale - exponent
        text = text[:-cut] or "0"
    return Decimal((1 if sign == 0x4000 else 0, tuple(int(c) for c in text), -dscale))


def _money_text(fraction_digits: int) -> TextDecoder:
    def decode(text: str) -> Decimal:
        negative = "-" in text or "(" in text
        digits = "".join(c for c in text if c.isdigit())
        if not digits:
            raise _fail("no digits in money value")
        if fraction_digits:
            stripped = text.rstrip(" )")
            tail = re.search(r"[^\d](\d+)[^\d]*\Z", stripped)
            if not tail or len(tail.group(1)) != fraction_digits:
                raise _fail(f"expected {fraction_digits} fraction digits (lc_monetary)")
        value = Decimal(int(digits)).scaleb(-fraction_digits)
        return -value if negative else value

    return decode


def _money_binary(fraction_digits: int) -> BinaryDecoder:
    unpack = _struct_binary(">q")

    def decode(data: bytes) -> Decimal:
        return Decimal(int(unpack(data))).scaleb(-fraction_digits)

    return decode


def _str_text(text: str) -> str:
    return text


def _str_binary(encoding: str) -> BinaryDecoder:
    def decode(data: bytes) -> str:
        return data.decode(encoding)

    return decode


def _char_text(text: str) -> str:
    """ "char": a single byte; bytes with the high bit set print as ``\\ooo``."""
    if len(text) == 4 and text[0] == "\\":
        return chr(int(text[1:], 8))
    if len(text) > 1:
        raise _fail('"char" holds one byte')
    return text


def _char_binary(data: bytes) -> str:
    if len(data) > 1:
        raise _fail('"char" holds one byte')
    return data.decode("latin-1").rstrip("\x00")  # charout prints a zero byte as nothing


_BYTEA_ESCAPE_RE = re.compile(rb"\\(\\|[0-3][0-7]{2})")


def _bytea_text(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    raw = text.encode("latin-1")
    if b"\\" in raw:
        if re.search(rb"\\(?!\\|[0-3][0-7]{2})", _BYTEA_ESCAPE_RE.sub(b"", raw)):
            raise _fail("bad escape in bytea escape format")
        return _BYTEA_ESCAPE_RE.sub(
            lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1), 8)]), raw
        )
    return raw


def _bytes_binary(data: bytes) -> bytes:
    return bytes(data)


def _date_from_days(days: int) -> date | PgDate:
    if _PY_MIN_DAYS <= days <= _PY_MAX_DAYS:
        return date.fromordinal(days + _PG_EPOCH_ORDINAL)
    return PgDate(days)


_DATE_RE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?\Z")


def _parse_date(text: str) -> int:
    match = _DATE_RE.match(text)
    if not match:
        raise _fail("expected an ISO date (DateStyle=ISO)")
    year, month, day = int(match.group(1)), int(match.group(2)), int(match.group(3))
    if match.group(4):
        year = 1 - year
    _check_civil(year, month, day)
    return _days_from_civil(year, month, day)


def _check_civil(year: int, month: int, day: int) -> None:
    if not 1 <= month <= 12 or not 1 <= day <= 31:
        raise _fail("month or day out of range")
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if day > (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]:
        raise _fail("day out of range for month")


def _date_text(text: str) -> date | PgDate:
    if len(text) == 10 and text[4] == "-":
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
    if text == "infinity":
        return PgDate(DATE_POS_INFINITY)
    if text == "-infinity":
        return PgDate(DATE_NEG_INFINITY)
    return _date_from_days(_parse_date(text))


_date_unpack = _struct_binary(">i")


def _date_binary(data: bytes) -> date | PgDate:
    days: int = _date_unpack(data)
    if days in (DATE_POS_INFINITY, DATE_NEG_INFINITY):
        return PgDate(days)
    return _date_from_days(days)


_TIME_RE = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_OFFSET_RE = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?")


def _parse_clock(text: str, pos: int = 0) -> tuple[int, int]:
    """HH:MM:SS[.ffffff] at ``pos`` -> (microseconds, end position)."""
    match = _TIME_RE.match(text, pos)
    if not match:
        raise _fail("expected HH:MM:SS[.ffffff]")
    hours, minutes, seconds = int(match.group(1)), int(match.group(2)), int(match.group(3))
    frac = match.group(4) or ""
    if minutes > 59 or seconds > 60:
        raise _fail("minutes or seconds out of range")
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int(frac.ljust(6, "0") or 0)
    return micros, match.end()


def _parse_offset(text: str, pos: int) -> tuple[int, int]:
    """[+-]HH[:MM[:SS]] at ``pos`` -> (seconds east of UTC, end position)."""
    match = _OFFSET_RE.match(text, pos)
    if not match:
        raise _fail("expected a UTC offset like +05:30")
    seconds = int(match.group(2)) * 3600 + int(match.group(3) or 0) * 60 + int(match.group(4) or 0)
    return (-seconds if match.group(1) == "-" else seconds), match.end()


def _time_from_micros(micros: int, offset: int | None) -> time | PgTime:
    if micros == _DAY_US:
        return PgTime(micros, offset)
    if not 0 <= micros < _DAY_US:
        raise _fail("time of day out of range")
    seconds, us = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    tz = None if offset is None else timezone(timedelta(seconds=offset))
    return time(hour, minute, second, us, tzinfo=tz)


def _time_text(text: str) -> time | PgTime:
    micros, end = _parse_clock(text)
    if end != len(text):
        raise _fail("trailing characters after time")
    return _time_from_micros(micros, None)


def _timetz_text(text: str) -> time | PgTime:
    micros, end = _parse_clock(text)
    offset, end = _parse_offset(text, end)
    if end != len(text):
        raise _fail("trailing characters after timetz")
    return _time_from_micros(micros, offset)


_time_unpack = _struct_binary(">q")


def _time_binary(data: bytes) -> time | PgTime:
    return _time_from_micros(_time_unpack(data), None)


_timetz_struct = struct.Struct(">qi")


def _timetz_binary(data: bytes) -> time | PgTime:
    if len(data) != 12:
        raise _fail(f"expected 12 bytes, got {len(data)}")
    micros, zone_west = _timetz_struct.unpack(data)
    return _time_from_micros(micros, -zone_west)


def _timestamp_from_micros(micros: int, with_tz: bool) -> datetime | PgTimestamp:
    if _PY_MIN_US <= micros <= _PY_MAX_US:
        return from_micros(micros, UTC if with_tz else None)
    return PgTimestamp(micros, with_tz)


def _parse_timestamp(text: str, with_tz: bool) -> datetime | PgTimestamp:
    if text == "infinity":
        return PgTimestamp(TIMESTAMP_POS_INFINITY, with_tz)
    if text == "-infinity":
        return PgTimestamp(TIMESTAMP_NEG_INFINITY, with_tz)
    bc = text.endswith(" BC")
    body = text[:-3] if bc else text
    date_part, sep, rest = body.partition(" ")
    if not sep:
        raise _fail("expected 'YYYY-MM-DD HH:MM:SS' (DateStyle=ISO)")
    days = _parse_date(date_part + (" BC" if bc else ""))
    micros, end = _parse_clock(rest)
    offset = 0
    if with_tz:
        offset, end = _parse_offset(rest, end)
    if end != len(rest):
        raise _fail("unexpected characters in timestamp")
    return _timestamp_from_micros(days * _DAY_US + micros - offset * 1_000_000, with_tz)


def _timestamp_text(text: str) -> datetime | PgTimestamp:
    if len(text) >= 19 and text[4] == "-" and text[-1].isdigit():
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if value.tzinfo is None:
                return value
    return _parse_timestamp(text, False)


def _timestamptz_text(text: str) -> datetime | PgTimestamp:
    if len(text) >= 22 and text[4] == "-" and text[-1].isdigit():
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            if value.tzinfo is not None:
                try:
                    return value.astimezone(UTC)
                except OverflowError:  # pushed past year 1 or 9999: the exact path below
                    pass
    return _parse_timestamp(text, True)


_int64_unpack = _struct_binary(">q")


def _timestamp_binary(data: bytes) -> datetime | PgTimestamp:
    micros: int = _int64_unpack(data)
    if micros in (TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY):
        return PgTimestamp(micros, False)
    return _timestamp_from_micros(micros, False)


def _timestamptz_binary(data: bytes) -> datetime | PgTimestamp:
    micros: int = _int64_unpack(data)
    if micros in (TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY):
        return PgTimestamp(micros, True)
    return _timestamp_from_micros(micros, True)


_INTERVAL_UNITS = {
    "year": ("m", 12),
    "years": ("m", 12),
    "mon": ("m", 1),
    "mons": ("m", 1),
    "day": ("d", 1),
    "days": ("d", 1),
}
_INTERVAL_CLOCK_RE = re.compile(r"([+-]?)(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?\Z")
_ISO_INTERVAL_RE = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+)(?:\.(\d{1,6}))?S)?)?\Z"
)


def _interval_text(text: str) -> Interval:
    """IntervalStyle postgres ("1 year 2 mons -3 days +04:05:06.5") or iso_8601 ("P1Y2M...")."""
    if text == "infinity":
        return Interval(_INT32_MAX, _INT32_MAX, _INT64_MAX)
    if text == "-infinity":
        return Interval(_INT32_MIN, _INT32_MIN, _INT64_MIN)
    if text.startswith("P"):
        return _iso_interval(text)
    months = days = micros = 0
    words = text.split()
    i = 0
    while i < len(words):
        word = words[i]
        clock = _INTERVAL_CLOCK_RE.match(word)
        if clock:
            sign, h, m, s, frac = clock.groups()
            value = ((int(h) * 60 + int(m)) * 60 + int(s)) * 1_000_000
            value += int((frac or "").ljust(6, "0") or 0)
            micros += -value if sign == "-" else value
            i += 1
            continue
        if i + 1 >= len(words) or words[i + 1] not in _INTERVAL_UNITS:
            raise _fail("expected IntervalStyle postgres or iso_8601")
        field, scale = _INTERVAL_UNITS[words[i + 1]]
        amount = _int_text(word) * scale
        if field == "m":
            months += amount
        else:
            days += amount
        i += 2
    if not words:
        raise _fail("empty interval")
    return Interval(months, days, micros)


def _iso_interval(text: str) -> Interval:
    match = _ISO_INTERVAL_RE.match(text)
    if not match or text in ("P", "PT") or text.endswith("T"):
        raise _fail("malformed ISO 8601 interval")
    years, months, weeks, days, hours, minutes, seconds, frac = match.groups()
    total_months = int(years or 0) * 12 + int(months or 0)
    total_days = int(weeks or 0) * 7 + int(days or 0)
    micros = ((int(hours or 0) * 60 + int(minutes or 0)) * 60 + int(seconds or 0)) * 1_000_000
    if frac:
        fraction = int(frac.ljust(6, "0"))
        micros += -fraction if (seconds or "").startswith("-") else fraction
    return Interval(total_months, total_days, micros)


_interval_struct = struct.Struct(">qii")


def _interval_binary(data: bytes) -> Interval:
    if len(data) != 16:
        raise _fail(f"expected 16 bytes, got {len(data)}")
    micros, days, months = _interval_struct.unpack(data)
    return Interval(months, days, micros)


def _uuid_text(text: str) -> uuid.UUID:
    return uuid.UUID(text)


def _uuid_binary(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(data))


def _jsonb_binary(encoding: str) -> BinaryDecoder:
    def decode(data: bytes) -> str:
        if not data or data[0] != 1:
            raise _fail("unknown jsonb binary version (expected 1)")
        return bytes(data[1:]).decode(encoding)

    return decode


IPValue: TypeAlias = ipaddress.IPv4Interface | ipaddress.IPv6Interface
NetValue: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


def _inet_text(text: str) -> IPValue:
    return ipaddress.ip_interface(text)


def _cidr_text(text: str) -> NetValue:
    return ipaddress.ip_network(text)


def _inet_parts(data: bytes) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """inet_send: family (2 = IPv4, 3 = IPv6), prefix bits, is_cidr, address length, address."""
    if len(data) < 4:
        raise _fail("shorter than the 4-byte inet header")
    family, bits, _is_cidr, size = data[0], data[1], data[2], data[3]
    address = bytes(data[4:])
    if (family, size) not in ((2, 4), (3, 16)) or len(address) != size:
        raise _fail("bad address family or length")
    if bits > size * 8:
        raise _fail("prefix longer than the address")
    return ipaddress.ip_address(address), bits


def _inet_binary(data: bytes) -> IPValue:
    address, bits = _inet_parts(data)
    return ipaddress.ip_interface((address, bits))


def _cidr_binary(data: bytes) -> NetValue:
    address, bits = _inet_parts(data)
    return ipaddress.ip_network((address, bits))


_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2})*\Z")


def _macaddr_text(count: int) -> TextDecoder:
    def decode(text: str) -> str:
        if len(text) != count * 3 - 1 or not _MAC_RE.match(text):
            raise _fail(f"expected {count} hex bytes separated by ':'")
        return text.lower()

    return decode


def _macaddr_binary(count: int) -> BinaryDecoder:
    def decode(data: bytes) -> str:
        if len(data) != count:
            raise _fail(f"expected {count} bytes, got {len(data)}")
        return ":".join(f"{b:02x}" for b in data)

    return decode


def _bit_text(text: str) -> str:
    if text.strip("01"):
        raise _fail("bit strings hold only 0 and 1")
    return text


def _bit_binary(data: bytes) -> str:
    if len(data) < 4:
        raise _fail("shorter than the 4-byte bit length")
    length = int.from_bytes(data[:4], "big", signed=True)
    body = data[4:]
    if length < 0 or len(body) != (length + 7) // 8:
        raise _fail("bit length does not match the data")
    if not length:
        return ""
    return bin(int.from_bytes(body, "big") | (1 << (len(body) * 8)))[3 : 3 + length]


def _lsn_text(text: str) -> LSN:
    return LSN.parse(text)


def _lsn_binary(data: bytes) -> LSN:
    return LSN(_struct_binary(">Q")(data))


# --- arrays ------------------------------------------------------------------------------------

_DIMS_RE = re.compile(r"((?:\[-?\d+:-?\d+\])+)=")
_BOUND_RE = re.compile(r"\[(-?\d+):(-?\d+)\]")
# array_isspace: what array_in skips, unlike str.isspace.
_ARRAY_SPACE = " \t\n\r\v\f"
_UNESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def _array_tokens(delimiter: str) -> re.Pattern[str]:
    d = re.escape(delimiter)
    return re.compile(
        rf'[ \t\n\r\v\f]*(?:(\{{)|(\}})|({d})|"((?:[^"\\]|\\.)*)"|((?:[^{{}}"\\{d}]|\\.)+))',
        re.DOTALL,
    )


def _parse_text_array(text: str, element: TextDecoder, tokens: re.Pattern[str]) -> list[Any]:
    """array_out's ``{...}`` syntax, with quoting, NULLs, nesting and ``[lo:hi]=`` bounds."""
    bounds: tuple[int, ...] = ()
    pos = 0
    if text.startswith("["):
        dims = _DIMS_RE.match(text)
        if not dims:
            raise _fail("malformed array dimensions")
        pairs = [(int(lo), int(hi)) for lo, hi in _BOUND_RE.findall(dims.group(1))]
        bounds = tuple(lo for lo, _ in pairs)
        pos = dims.end()
    stack: list[list[Any]] = []
    result: list[Any] | None = None
    expect_item = True
    end = len(text)
    while pos < end:
        match = tokens.match(text, pos)
        if not match:
            if text[pos:].strip(_ARRAY_SPACE):
                raise _fail(f"unexpected character at position {pos}")
            break
        pos = match.end()
        opening, closing, delim, quoted, bare = match.groups()
        if opening:
            if result is not None or (stack and not expect_item):
                raise _fail("unexpected '{'")
            new: list[Any] = []
            if stack:
                stack[-1].append(new)
            stack.append(new)
            expect_item = True
        elif closing:
            if not stack or (expect_item and stack[-1]):
                raise _fail("unexpected '}'")
            done = stack.pop()
            expect_item = False
            if not stack:
                result = done
        elif delim:
            if not stack or expect_item:
                raise _fail("unexpected delimiter")
            expect_item = True
        else:
            if not stack or not expect_item or result is not None:
                raise _fail("element outside braces")
            if quoted is not None:
                stack[-1].append(element(_UNESCAPE_RE.sub(r"\1", quoted)))
            else:
                word = bare.rstrip(_ARRAY_SPACE)
                if word.upper() == "NULL":
                    stack[-1].append(None)
                else:
                    stack[-1].append(element(_UNESCAPE_RE.sub(r"\1", word)))
            expect_item = False
    if result is None or stack:
        raise _fail("unbalanced braces")
    if bounds and any(b != 1 for b in bounds):
        return BoundedList(result, bounds)
    return result


_array_header = struct.Struct(">iiI").unpack_from
_int32_pair = struct.Struct(">ii").unpack_from
_int32 = struct.Struct(">i").unpack_from


def _parse_binary_array(data: bytes, element_for: Callable[[int], BinaryDecoder]) -> list[Any]:
    """array_send: ndim, has-nulls flag, element OID, (size, lower bound) per dimension, then
    each element as a 4-byte length (-1 for NULL) and its bytes."""
    if len(data) < 12:
        raise _fail("shorter than the 12-byte array header")
    ndim, _flags, element_oid = _array_header(data)
    if ndim == 0:
        return []
    if not 0 < ndim <= 6 or len(data) < 12 + 8 * ndim:
        raise _fail("bad number of dimensions")
    dims = [_int32_pair(data, 12 + 8 * i) for i in range(ndim)]
    if any(size < 0 for size, _ in dims):
        raise _fail("negative dimension size")
    decode = element_for(element_oid)
    pos = 12 + 8 * ndim
    view = memoryview(data)
    total = 1
    for size, _ in dims:
        total *= size
    flat: list[Any] = []
    for _ in range(total):
        if pos + 4 > len(data):
            raise _fail("array data ends early")
        (length,) = _int32(data, pos)
        pos += 4
        if length == -1:
            flat.append(None)
            continue
        if length < 0 or pos + length > len(data):
            raise _fail("array element runs past the end")
        flat.append(decode(bytes(view[pos : pos + length])))
        pos += length
    if pos != len(data):
        raise _fail("trailing bytes after array elements")
    nested: list[Any] = flat
    for size, _ in reversed(dims[1:]):
        nested = [nested[i : i + size] for i in range(0, len(nested), size)]
    bounds = tuple(lo for _, lo in dims)
    if any(b != 1 for b in bounds):
        return BoundedList(nested, bounds)
    return nested


def _vector_text(element: TextDecoder) -> TextDecoder:
    """int2vector / oidvector print as space-separated numbers, without braces."""

    def decode(text: str) -> list[Any]:
        return [element(word) for word in text.split()]

    return decode


# --- type resolution ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedType:
    """A column type with domains unwrapped: what codecs and the Arrow mapping dispatch on.

    ``name`` is the built-in name (``int4``, ``timestamptz``), ``array`` for arrays (see
    ``element``), or ``enum``, ``composite``, ``range``, ``multirange``, ``unknown``.
    """

    oid: int
    name: str
    element: ResolvedType | None = None
    delimiter: str = ","
    display_name: str = ""
    # A domain's type modifier (numeric(10,2)): used where the column's own is -1.
    type_modifier: int = -1


@dataclass(frozen=True, slots=True)
class Codec:
    """Text and binary decoders of one type, and the type's name for error messages."""

    type_name: str
    text: TextDecoder
    binary: BinaryDecoder


_VECTOR_TYPES = {22: 21, 30: 26}  # int2vector, oidvector: element oid
# Built-in ranges' subtypes and multiranges' range types (pg_range).
_BUILTIN_RANGE_INNER = {
    3904: 23,
    3906: 1700,
    3908: 1114,
    3910: 1184,
    3912: 1082,
    3926: 20,
    4451: 3904,
    4532: 3906,
    4533: 3908,
    4534: 3910,
    4535: 3912,
    4536: 3926,
}
_OPAQUE_NAMES = ("composite", "range", "multirange", "unknown", "enum")


def _preview(raw: object, limit: int = 80) -> str:
    text = repr(raw)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TypeRegistry:
    """Resolves type OIDs to codecs: built-ins by OID, others through ``TypeInfo``.

    ``types`` may be a dict the caller keeps filling as the stream announces types; lookups of
    OIDs it did not know are retried when it grows. ``encoding`` is the client encoding text
    arrives in; ``money_fraction_digits`` the digits after the point in lc_monetary (2 for C and
    most locales; binary money is a count of the smallest unit, so this sets its scale).
    """

    def __init__(
        self,
        types: Mapping[int, TypeInfo] | None = None,
        *,
        encoding: str = "utf-8",
        money_fraction_digits: int = 2,
    ) -> None:
        self.types: Mapping[int, TypeInfo] = types if types is not None else {}
        self.encoding = encoding
        self.money_fraction_digits = money_fraction_digits
        self._codecs: dict[int, Codec] = {}
        self._resolved: dict[int, ResolvedType] = {}
        self._known_size = len(self.types)
        self._tables: dict[int, tuple[Table, int, list[Codec]]] = {}
        self._field_texts: dict[int, Callable[[bytes], str]] = {}
        self._str_binary = _str_binary(encoding)
        self._scalar: dict[str, tuple[TextDecoder, BinaryDecoder]] = self._scalar_codecs()

    def _scalar_codecs(self) -> dict[str, tuple[TextDecoder, BinaryDecoder]]:
        text_bin = (_str_text, self._str_binary)
        uint32 = _struct_binary(">I")
        return {
            "bool": (_bool_text, _bool_binary),
            "int2": (_int_text, _struct_binary(">h")),
            "int4": (_int_text, _struct_binary(">i")),
            "int8": (_int_text, _struct_binary(">q")),
            "oid": (_int_text, uint32),
            "xid": (_int_text, uint32),
            "cid": (_int_text, uint32),
            "xid8": (_int_text, _struct_binary(">Q")),
            "float4": (_float_text, _float4_binary),
            "float8": (_float_text, _struct_binary(">d")),
            "numeric": (_numeric_text, _numeric_binary),
            "money": (
                _money_text(self.money_fraction_digits),
                _money_binary(self.money_fraction_digits),
            ),
            "text": text_bin,
            "varchar": text_bin,
            "bpchar": text_bin,
            "name": text_bin,
            "xml": text_bin,
            "char": (_char_text, _char_binary),
            "bytea": (_bytea_text, _bytes_binary),
            "date": (_date_text, _date_binary),
            "time": (_time_text, _time_binary),
            "timetz": (_timetz_text, _timetz_binary),
            "timestamp": (_timestamp_text, _timestamp_binary),
            "timestamptz": (_timestamptz_text, _timestamptz_binary),
            "interval": (_interval_text, _interval_binary),
            "uuid": (_uuid_text, _uuid_binary),
            "json": text_bin,
            "jsonb": (_str_text, _jsonb_binary(self.encoding)),
            "inet": (_inet_text, _inet_binary),
            "cidr": (_cidr_text, _cidr_binary),
            "macaddr": (_macaddr_text(6), _macaddr_binary(6)),
            "macaddr8": (_macaddr_text(8), _macaddr_binary(8)),
            "bit": (_bit_text, _bit_binary),
            "varbit": (_bit_text, _bit_binary),
            "pg_lsn": (_lsn_text, _lsn_binary),
            "enum": text_bin,
            **{name: (_str_text, decode) for name, decode in GEOMETRIC.items()},
        }

    def _refresh(self) -> None:
        """Forget unresolved lookups when the caller's type mapping has grown."""
        size = len(self.types)
        if size != self._known_size:
            self._known_size = size
            self._codecs.clear()
            self._resolved.clear()
            self._tables.clear()
            self._field_texts.clear()

    def resolve(self, type_oid: int) -> ResolvedType:
        """What ``type_oid`` is, with domains unwrapped and array elements resolved."""
        self._refresh()
        found = self._resolved.get(type_oid)
        if found is None:
            found = self._resolve(type_oid, 0)
            self._resolved[type_oid] = found
        return found

    def _resolve(self, oid: int, depth: int) -> ResolvedType:
        if depth > 16:
            return ResolvedType(oid, "unknown", display_name=f"type {oid}")
        builtin = BY_OID.get(oid)
        if builtin is not None:
            if builtin.category == "A" and builtin.element_oid:
                element = self._resolve(builtin.element_oid, depth + 1)
                delimiter = ";" if builtin.element_oid == 603 else ","  # box[] uses ';'
                name = "vector" if oid in _VECTOR_TYPES else "array"
                return ResolvedType(oid, name, element, delimiter, builtin.name)
            name = builtin.name if builtin.name in self._scalar else "unknown"
            if builtin.category == "R":
                name = "range" if "multi" not in builtin.name else "multirange"
                inner = _BUILTIN_RANGE_INNER.get(oid)
                subtype = self._resolve(inner, depth + 1) if inner else None
                return ResolvedType(oid, name, subtype, display_name=builtin.name)
            return ResolvedType(oid, name, display_name=builtin.name)
        info = self.types.get(oid)
        if info is None:
            return ResolvedType(oid, "unknown", display_name=f"type {oid}")
        display = f"{info.namespace}.{info.name}"
        if info.kind == "d" and info.base_oid:
            base = self._resolve(info.base_oid, depth + 1)
            modifier = info.base_modifier if info.base_modifier != -1 else base.type_modifier
            return ResolvedType(
                base.oid, base.name, base.element, base.delimiter, display, modifier
            )
        if info.element_oid and info.kind == "b":
            element = self._resolve(info.element_oid, depth + 1)
            return ResolvedType(oid, "array", element, ",", display)
        kind = {"e": "enum", "c": "composite", "r": "range", "m": "multirange"}.get(
            info.kind, "unknown"
        )
        if kind in ("range", "multirange") and info.element_oid:
            # A range's subtype, a multirange's range type (from pg_range).
            element = self._resolve(info.element_oid, depth + 1)
            return ResolvedType(oid, kind, element, display_name=display)
        return ResolvedType(oid, kind, display_name=display)

    def codec(self, type_oid: int) -> Codec:
        """The text and binary decoders for ``type_oid``; unknown types give text as ``str``
        and binary as ``bytes``."""
        self._refresh()
        found = self._codecs.get(type_oid)
        if found is None:
            found = self._build(self.resolve(type_oid))
            self._codecs[type_oid] = found
        return found

    def _build(self, resolved: ResolvedType) -> Codec:
        name = resolved.display_name or resolved.name
        if resolved.name in ("array", "vector") and resolved.element is not None:
            element = self._build(resolved.element)
            element_text = element.text
            if resolved.name == "vector":
                text_decoder = _vector_text(element_text)
            else:
                tokens = _array_tokens(resolved.delimiter)

                def text_decoder(text: str) -> list[Any]:
                    return _parse_text_array(text, element_text, tokens)

            expected_oid = resolved.element.oid
            element_binary = element.binary

            def element_for(oid: int) -> BinaryDecoder:
                if oid in (expected_oid, 0):
                    return element_binary
                return self.codec(oid).binary

            def binary_decoder(data: bytes) -> list[Any]:
                return _parse_binary_array(data, element_for)

            return Codec(name, text_decoder, binary_decoder)
        if resolved.name == "range" and resolved.element is not None:
            return Codec(name, _str_text, range_binary(self._binary_text(resolved.element)))
        if resolved.name == "multirange" and resolved.element is not None:
            inner = self._build(resolved.element)
            return Codec(name, _str_text, multirange_binary(inner.binary))
        if resolved.name == "composite":
            return Codec(name, _str_text, composite_binary(self._field_text))
        pair = self._scalar.get(resolved.name)
        if pair is None:
            return Codec(name, _str_text, _bytes_binary)
        return Codec(name, pair[0], pair[1])

    def _binary_text(self, resolved: ResolvedType) -> Callable[[bytes], str]:
        """A binary value of ``resolved`` printed as its output function prints it (a range's
        bounds, a composite's fields)."""
        if resolved.name == "unknown":
            label = resolved.display_name or f"type {resolved.oid}"

            def unknown(data: bytes) -> str:
                raise _fail(f"pgcdc cannot print binary values of {label}")

            return unknown
        binary = self._build(resolved).binary
        scalar = resolved.element or resolved
        if scalar.name in ("float4", "float8"):
            # float4out switches to exponents from 1e6 on, float8out from 1e15.
            fixed_below = 6 if scalar.name == "float4" else 15
            if resolved.element is None:
                return lambda data: float_text(binary(data), fixed_below)
            return lambda data: pg_text(binary(data), fixed_below)
        if resolved.name == "money" or (
            resolved.element is not None and resolved.element.name == "money"
        ):
            # cash_out's text has a currency symbol and group separators numeric's lacks.
            digits = self.money_fraction_digits

            def money(value: Any) -> Any:
                if isinstance(value, list):
                    return [money(v) for v in value]
                return None if value is None else money_text(int(value.scaleb(digits)), digits)

            return lambda data: pg_text(money(binary(data)))
        return lambda data: pg_text(binary(data))

    def _field_text(self, type_oid: int, data: bytes) -> str:
        """One composite field (its type OID comes with it) as record_out prints it."""
        self._refresh()
        found = self._field_texts.get(type_oid)
        if found is None:
            found = self._field_texts[type_oid] = self._binary_text(self.resolve(type_oid))
        return found(data)

    def to_python(self, raw: RawValue, type_oid: int, type_modifier: int = -1) -> Any:
        """One value to Python; None and UNCHANGED_TOAST pass through unchanged."""
        if raw is None or raw is UNCHANGED_TOAST:
            return raw
        codec = self.codec(type_oid)
        return decode_value(codec, raw)

    def converters(self, table: Table) -> list[Codec]:
        """The codecs of ``table``'s columns, resolved once per Table object."""
        self._refresh()
        entry = self._tables.get(id(table))
        if entry is not None and entry[0] is table:
            return entry[2]
        codecs = [self.codec(column.type_oid) for column in table.columns]
        if len(self._tables) >= 4096:
            self._tables.clear()
        # Keeping ``table`` in the entry keeps its id from being reused while cached.
        self._tables[id(table)] = (table, 0, codecs)
        return codecs

    def row_to_python(self, table: Table, row: Sequence[RawValue]) -> tuple[Any, ...]:
        """A row of raw values to Python values, in column order."""
        codecs = self.converters(table)
        if len(row) != len(codecs):
            raise DecodeError(
                f"row of {table.qualified_name} has {len(row)} values but the table has "
                f"{len(codecs)} columns; the Relation message and the row disagree"
            )
        try:
            return tuple(
                [
                    raw
                    if raw is None or raw.__class__ is Unchanged
                    else (codec.text(raw) if raw.__class__ is str else codec.binary(raw))  # type: ignore[arg-type]
                    for codec, raw in zip(codecs, row, strict=True)
                ]
            )
        except Exception:
            # Again, slowly: names the failing column, and accepts bytearray/memoryview.
            return tuple(
                raw
                if raw is None or raw is UNCHANGED_TOAST
                else decode_value(codec, raw, column, table)
                for column, codec, raw in zip(table.columns, codecs, row, strict=True)
            )


def decode_value(
    codec: Codec, raw: str | bytes, column: Column | None = None, table: Table | None = None
) -> Any:
    """``raw`` through ``codec``; failures become a DecodeError naming type, value and column."""
    try:
        if isinstance(raw, str):
            return codec.text(raw)
        if isinstance(raw, (bytes, bytearray, memoryview)):
            return codec.binary(bytes(raw))
        raise ValueError(f"expected str or bytes, got {type(raw).__name__}")
    except (ValueError, TypeError, struct.error, IndexError, OverflowError, ArithmeticError) as exc:
        fmt = "text" if isinstance(raw, str) else "binary"
        where = f" in column {column.name!r} of {table.qualified_name}" if column and table else ""
        raise DecodeError(
            f"cannot decode {codec.type_name} value {_preview(raw)} ({fmt} format){where}: {exc}"
        ) from exc


_DEFAULT_REGISTRY = TypeRegistry()
_REGISTRIES: dict[int, tuple[Mapping[int, TypeInfo], TypeRegistry]] = {}

Types: TypeAlias = Mapping[int, TypeInfo] | TypeRegistry | None


def registry_for(types: Types) -> TypeRegistry:
    """The registry for ``types``: itself, a cached one per mapping, or the built-ins only."""
    if types is None:
        return _DEFAULT_REGISTRY
    if isinstance(types, TypeRegistry):
        return types
    entry = _REGISTRIES.get(id(types))
    if entry is not None and entry[0] is types:
        return entry[1]
    if len(_REGISTRIES) >= 256:
        _REGISTRIES.clear()
    registry = TypeRegistry(types)
    _REGISTRIES[id(types)] = (types, registry)
    return registry


def to_python(raw: RawValue, type_oid: int, type_modifier: int = -1, types: Types = None) -> Any:
    """One raw value (text ``str`` or binary ``bytes``) of type ``type_oid`` to Python."""
    return registry_for(types).to_python(raw, type_oid, type_modifier)


def row_to_python(table: Table, row: Sequence[RawValue], types: Types = None) -> tuple[Any, ...]:
    """A row of raw values to Python values; converters are resolved once per Table."""
    return registry_for(types).row_to_python(table, row)


# --- back to PostgreSQL's text form ------------------------------------------------------------


def _quote_element(text: str) -> str:
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n\r\v\f;'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def pg_text(value: Any, fixed_below: int = 15) -> str:
    """A Python value from this module in PostgreSQL's text form (DateStyle ISO, UTC).

    Used where a value must be kept as text because a typed container cannot hold it. Floats
    print as float8out does; ``fixed_below=6`` prints them as float4out (a real[]'s elements).
    """
    if isinstance(value, list):
        body = "{" + ",".join(_element_text(v, fixed_below) for v in value) + "}"
        if isinstance(value, BoundedList):
            sizes: list[int] = []
            level: Any = value
            for _ in value.lower_bounds:
                sizes.append(len(level))
                level = level[0] if level else []
            dims = "".join(
                f"[{lo}:{lo + size - 1}]"
                for lo, size in zip(value.lower_bounds, sizes, strict=True)
            )
            return f"{dims}={body}"
        return body
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return float_text(value, fixed_below)  # the digits float8out/float4out print
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, Decimal):
        return format(value, "f")  # never scientific notation, as numeric_out
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
            with_tz = True
        else:
            with_tz = False
        micros = (value - _PG_EPOCH) // timedelta(microseconds=1)
        return str(PgTimestamp(micros, with_tz))
    if isinstance(value, time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        text = _format_time(micros + value.microsecond)
        offset = value.utcoffset()
        return text if offset is None else text + _format_offset(int(offset.total_seconds()))
    if isinstance(value, date):
        return str(PgDate(value.toordinal() - _PG_EPOCH_ORDINAL))
    if isinstance(value, (ipaddress.IPv4Interface, ipaddress.IPv6Interface)):
        full = value.network.prefixlen == value.max_prefixlen
        return str(value.ip) if full else str(value)  # as inet_out prints it
    if value is None:
        return "NULL"
    return str(value)


def _element_text(value: Any, fixed_below: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list) and not isinstance(value, BoundedList):
        return "{" + ",".join(_element_text(v, fixed_below) for v in value) + "}"
    return _quote_element(pg_text(value, fixed_below))


__all__ = [
    "BoundedList",
    "Codec",
    "Interval",
    "PgDate",
    "PgTime",
    "PgTimestamp",
    "ResolvedType",
    "TypeRegistry",
    "decode_value",
    "pg_text",
    "registry_for",
    "row_to_python",
    "to_python",
]
