"""The kinds of Delta table a source table can have, apart from the code that writes them: the
pipeline's settings name them, and the receiver's process unpickles those settings without
importing deltalake."""

from __future__ import annotations

import enum
from collections.abc import Collection

from pgcdc.errors import InvalidOption


class SinkKind(enum.Enum):
    CHANGELOG = "changelog"
    MIRROR = "mirror"
    HISTORY = "history"


def parse_kinds(names: Collection[str]) -> tuple[SinkKind, ...]:
    try:
        return tuple(SinkKind(n.strip()) for n in names)
    except ValueError:
        raise InvalidOption(
            f"unknown table kind in {sorted(names)}; use changelog, mirror and/or history"
        ) from None


__all__ = ["SinkKind", "parse_kinds"]
