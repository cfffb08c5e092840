"""PostgreSQL timestamps (microseconds since 2000-01-01) as datetimes: the one conversion the
protocol's send times, pgoutput's commit times and the type registry's timestamps share.

``_from_micros`` is the reference. Every transaction's commit time passes here, so the build
also compiles ``_pgtime.c``, the same conversion in C; ``from_micros`` is that one unless it is
not built, ``PGCDC_PURE_PYTHON`` is set, or (in a source checkout) the C source changed after
its build (``tests/test_pgtime.py`` checks the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final

from pgcdc._native import c_extension

FromMicros = Callable[..., datetime]


def _from_micros(micros: int, zone: tzinfo | None = UTC) -> datetime:
    """The datetime ``micros`` microseconds after 2000-01-01 00:00 in ``zone`` (None: naive);
    OverflowError when a datetime cannot hold it.

    Seconds and microseconds are split here: ``timedelta(microseconds=...)`` normalises a
    large microsecond count more slowly."""
    seconds, rest = divmod(micros, 1_000_000)
    return datetime(2000, 1, 1, tzinfo=zone) + timedelta(0, seconds, rest)


def native_from_micros() -> FromMicros | None:
    """``_pgtime.from_micros``, or None where the reference must run instead."""
    module = c_extension("pgcdc._pgtime")
    return None if module is None else module.from_micros


from_micros: Final[FromMicros] = native_from_micros() or _from_micros
