"""Binary forms of the types pgcdc keeps as PostgreSQL text: geometric types, ranges,
multiranges and composites (and the money fields inside them).

pgcdc holds these values as the text their output function prints, so a stream in pgoutput's
binary format must give the very same text as one in text format (under the settings the
receiver forces: extra_float_digits=3, DateStyle ISO, TimeZone UTC). Each decoder here turns
the type's send format into that text; what it cannot print exactly (an element or field of a
type pgcdc knows nothing about) is a ``ValueError``, never a guess.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Context, Decimal, localcontext
from fractions import Fraction

BinaryToText = Callable[[bytes], str]

_FLOAT8 = struct.Struct(">d")
_FLOAT4 = struct.Struct(">f")
_FLOAT4_BITS = struct.Struct(">I")
_INT32 = struct.Struct(">i")
_UINT32_INT32 = struct.Struct(">Ii")


def _fail(reason: str) -> ValueError:
    return ValueError(reason)


def float_text(value: float, fixed_below: int = 15) -> str:
    """``float8out`` (``float4out`` with ``fixed_below=6``): the shortest digits that read back
    exactly, in fixed notation for decimal exponents from -4 to ``fixed_below - 1`` and as
    ``d.ddde+XX`` otherwise. ``value`` must already be the shortest for its width, as the
    decoders give it (``repr`` of a float4 widened to a double is not)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = _shortest(abs(value), fixed_below == 6)
    sign = 1 if value < 0 else 0
    leading = len(digits) - 1 + exponent  # the decimal exponent of the first digit
    minus = "-" if sign else ""
    if -4 <= leading < fixed_below:
        return minus + format(Decimal((0, digits, exponent)), "f")
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{minus}{mantissa}e{'-' if leading < 0 else '+'}{abs(leading):02d}"


def _shortest(value: float, single: bool) -> tuple[int, tuple[int, ...], int]:
    """The digits float8out/float4out print for positive ``value``: Python's shortest repr,
    except where that lands exactly on the midpoint to a neighbour. Python takes a midpoint
    that reads back by rounding to even; PostgreSQL's Ryu (built without STRICTLY_SHORTEST)
    never does, and prints the shortest digits strictly between the midpoints."""
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    while len(digits) > 1 and digits[-1] == 0:
        digits = digits[:-1]
        exponent += 1
    if exponent < 0 and int("".join(map(str, digits))) % 5**-exponent:
        return sign, digits, exponent  # not a binary fraction, so not a midpoint
    actual = _FLOAT4.unpack(_FLOAT4.pack(value))[0] if single else value
    below, above = _neighbours(actual, single)
    exact = Fraction(actual)
    chosen = Fraction(Decimal((0, digits, exponent)))
    if (exact + Fraction(below)) / 2 < chosen and (
        math.isinf(above) or chosen < (exact + Fraction(above)) / 2
    ):
        return sign, digits, exponent
    with localcontext(Context(prec=800)):  # exact for any float8's decimal expansion
        low, high = (Decimal(actual) + Decimal(below)) / 2, (Decimal(actual) + Decimal(above)) / 2
        for count in range(len(digits) + 1, 18):
            quantum = Decimal((0, (1,), Decimal(actual).adjusted() - count + 1))
            candidate = Decimal(actual).quantize(quantum, rounding=ROUND_HALF_EVEN)
            if low < candidate < high:
                found = candidate.normalize().as_tuple()
                assert isinstance(found.exponent, int)
                return 0, found.digits, found.exponent
    return sign, digits, exponent


def _neighbours(value: float, single: bool) -> tuple[float, float]:
    """The next smaller and larger positive values of the width (``inf`` past the largest)."""
    if single:
        bits: int = _FLOAT4_BITS.unpack(_FLOAT4.pack(value))[0]
        below: float = _FLOAT4.unpack(_FLOAT4_BITS.pack(bits - 1))[0]
        if bits + 1 >= 0x7F800000:
            return below, math.inf
        return below, _FLOAT4.unpack(_FLOAT4_BITS.pack(bits + 1))[0]
    return math.nextafter(value, 0.0), math.nextafter(value, math.inf)


# --- geometric types (geo_ops.c: all float8, printed by float8out) ---------------------------


def money_text(cents: int, fraction_digits: int = 2) -> str:
    """cash_out's text of a money value held as ``cents`` (units of the last fraction digit),
    under the conventions of lc_monetary C and en_US ("$", groups of three split by ",", "."
    before the fraction, "-" first when negative): other locales print differently, and that
    difference is documented, not guessed at."""
    sign = "-" if cents < 0 else ""
    digits = str(abs(cents)).rjust(fraction_digits + 1, "0")
    whole = digits[: len(digits) - fraction_digits] if fraction_digits else digits
    groups = []
    while len(whole) > 3:
        groups.append(whole[-3:])
        whole = whole[:-3]
    groups.append(whole)
    text = ",".join(reversed(groups))
    if fraction_digits:
        text += "." + digits[len(digits) - fraction_digits :]
    return f"{sign}${text}"


def _floats(data: bytes, count: int, offset: int = 0) -> list[str]:
    if len(data) != offset + 8 * count:
        raise _fail(f"expected {offset + 8 * count} bytes, got {len(data)}")
    return [float_text(_FLOAT8.unpack_from(data, offset + 8 * i)[0]) for i in range(count)]


def _points(texts: list[str]) -> str:
    return ",".join(f"({texts[i]},{texts[i + 1]})" for i in range(0, len(texts), 2))


def point_binary(data: bytes) -> str:
    return _points(_floats(data, 2))


def line_binary(data: bytes) -> str:
    a, b, c = _floats(data, 3)
    return f"{{{a},{b},{c}}}"


def lseg_binary(data: bytes) -> str:
    return f"[{_points(_floats(data, 4))}]"


def box_binary(data: bytes) -> str:
    return _points(_floats(data, 4))  # the high corner first, as box_out prints it


def circle_binary(data: bytes) -> str:
    x, y, radius = _floats(data, 3)
    return f"<({x},{y}),{radius}>"


def _point_count(data: bytes, offset: int) -> int:
    if len(data) < offset + 4:
        raise _fail("truncated point count")
    count: int = _INT32.unpack_from(data, offset)[0]
    if count < 0:
        raise _fail(f"negative point count {count}")
    return count


def path_binary(data: bytes) -> str:
    if not data:
        raise _fail("empty path")
    closed = data[0] != 0
    points = _points(_floats(data, 2 * _point_count(data, 1), 5))
    return f"({points})" if closed else f"[{points}]"


def polygon_binary(data: bytes) -> str:
    return f"({_points(_floats(data, 2 * _point_count(data, 0), 4))})"


GEOMETRIC: dict[str, BinaryToText] = {
    "point": point_binary,
    "line": line_binary,
    "lseg": lseg_binary,
    "box": box_binary,
    "path": path_binary,
    "polygon": polygon_binary,
    "circle": circle_binary,
}


# --- ranges, multiranges, composites ---------------------------------------------------------

_SPACE = frozenset(" \t\n\r\v\f")
_RANGE_SPECIAL = frozenset('"\\()[],') | _SPACE
_RECORD_SPECIAL = frozenset('"\\(),') | _SPACE

_EMPTY, _LB_INC, _UB_INC, _LB_INF, _UB_INF = 0x01, 0x02, 0x04, 0x08, 0x10


def _quoted(text: str, special: frozenset[str]) -> str:
    """As range_bound_escape and record_out quote: when empty or holding a special character,
    in double quotes with quotes and backslashes doubled."""
    if text and not any(ch in special for ch in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _sized(data: bytes, offset: int) -> tuple[bytes | None, int]:
    """A length-prefixed value at ``offset`` (length -1: NULL) and the offset after it."""
    if len(data) < offset + 4:
        raise _fail("truncated length")
    size: int = _INT32.unpack_from(data, offset)[0]
    offset += 4
    if size == -1:
        return None, offset
    if size < 0 or len(data) < offset + size:
        raise _fail(f"bad value length {size}")
    return data[offset : offset + size], offset + size


def range_binary(bound_text: BinaryToText) -> BinaryToText:
    """range_send's form (a flags byte, then the bounds present) as range_out prints it."""

    def decode(data: bytes) -> str:
        if not data:
            raise _fail("empty range")
        flags = data[0]
        if flags & _EMPTY:
            if len(data) != 1:
                raise _fail("an empty range with bounds")
            return "empty"
        offset = 1
        texts = []
        for infinite in (_LB_INF, _UB_INF):
            if flags & infinite:
                texts.append("")
                continue
            raw, offset = _sized(data, offset)
            if raw is None:
                raise _fail("a NULL range bound")
            texts.append(_quoted(bound_text(raw), _RANGE_SPECIAL))
        if offset != len(data):
            raise _fail(f"{len(data) - offset} bytes after the range")
        lower = "[" if flags & _LB_INC else "("
        upper = "]" if flags & _UB_INC else ")"
        return f"{lower}{texts[0]},{texts[1]}{upper}"

    return decode


def multirange_binary(range_text: BinaryToText) -> BinaryToText:
    """multirange_send's form (a count, then length-prefixed ranges) as multirange_out prints
    it."""

    def decode(data: bytes) -> str:
        if len(data) < 4:
            raise _fail("truncated multirange")
        count: int = _INT32.unpack_from(data)[0]
        offset = 4
        texts = []
        for _ in range(count):
            raw, offset = _sized(data, offset)
            if raw is None:
                raise _fail("a NULL range in a multirange")
            texts.append(range_text(raw))
        if offset != len(data):
            raise _fail(f"{len(data) - offset} bytes after the multirange")
        return "{" + ",".join(texts) + "}"

    return decode


def composite_binary(field_text: Callable[[int, bytes], str]) -> BinaryToText:
    """record_send's form (a field count, then each field's type OID and length-prefixed value)
    as record_out prints it; ``field_text`` prints one field's value given its type OID."""

    def decode(data: bytes) -> str:
        if len(data) < 4:
            raise _fail("truncated composite")
        count: int = _INT32.unpack_from(data)[0]
        offset = 4
        texts = []
        for _ in range(count):
            if len(data) < offset + 8:
                raise _fail("truncated composite field")
            oid, size = _UINT32_INT32.unpack_from(data, offset)
            offset += 8
            if size == -1:
                texts.append("")
                continue
            if size < 0 or len(data) < offset + size:
                raise _fail(f"bad field length {size}")
            raw = data[offset : offset + size]
            offset += size
            texts.append(_quoted(field_text(oid, raw), _RECORD_SPECIAL))
        if offset != len(data):
            raise _fail(f"{len(data) - offset} bytes after the composite")
        return "(" + ",".join(texts) + ")"

    return decode
