"""PostgreSQL timestamps as datetimes: the C conversion (``pgcdc._pgtime``) against its
reference (``pgtime._from_micros``), value for value, over the whole range a datetime holds and
past both its ends."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pgcdc import pgtime
from pgcdc._native import PURE_PYTHON_ENV

NATIVE = pgtime.native_from_micros()
needs_native = pytest.mark.skipif(
    NATIVE is None, reason="built without C extensions (PGCDC_PURE_PYTHON=1)"
)

_DAY = 86_400_000_000
# 0001-01-01 00:00 and 9999-12-31 23:59:59.999999, in microseconds since 2000-01-01.
FIRST = (datetime(1, 1, 1) - datetime(2000, 1, 1)) // timedelta(microseconds=1)
LAST = (datetime.max - datetime(2000, 1, 1)) // timedelta(microseconds=1)
ZONES: list[tzinfo | None] = [UTC, None, timezone(timedelta(hours=5, minutes=30))]


def _outcome(convert: Callable[..., datetime], micros: int, zone: tzinfo | None) -> object:
    """The datetime (with its zone, which equality ignores) or the exception type."""
    try:
        moment = convert(micros, zone)
    except OverflowError:
        return OverflowError
    return moment, moment.tzinfo


@needs_native
@given(
    micros=st.one_of(st.integers(FIRST, LAST), st.integers(-(2**70), 2**70)),
    zone=st.sampled_from(ZONES),
)
# The ends of the range and one past them; the int64 infinities PostgreSQL sends.
@example(FIRST, UTC)
@example(LAST, UTC)
@example(FIRST - 1, UTC)
@example(LAST + 1, None)
@example(2**63 - 1, UTC)
@example(-(2**63), UTC)
@example(2**64, UTC)
# Around 2000-01-01, day boundaries on both sides of it, and leap days (2000 is a leap year,
# 1900 and 2100 are not).
@example(0, UTC)
@example(-1, UTC)
@example(_DAY - 1, UTC)
@example(-_DAY, None)
@example((datetime(2000, 2, 29) - datetime(2000, 1, 1)) // timedelta(microseconds=1), UTC)
@example((datetime(1900, 3, 1) - datetime(2000, 1, 1)) // timedelta(microseconds=1) - 1, UTC)
@example((datetime(2100, 3, 1) - datetime(2000, 1, 1)) // timedelta(microseconds=1) - 1, UTC)
def test_the_c_conversion_is_the_reference(micros: int, zone: tzinfo | None) -> None:
    assert NATIVE is not None
    assert _outcome(NATIVE, micros, zone) == _outcome(pgtime._from_micros, micros, zone)


@needs_native
def test_the_zone_defaults_to_utc() -> None:
    assert NATIVE is not None
    moment = NATIVE(123_456_789)
    assert moment == pgtime._from_micros(123_456_789)
    assert moment.tzinfo is UTC


def test_the_c_conversion_is_the_one_used() -> None:
    """The decoders call ``from_micros``: the C one wherever it is built."""
    if NATIVE is None or os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        assert pgtime.from_micros is pgtime._from_micros
    else:
        assert pgtime.from_micros is NATIVE
