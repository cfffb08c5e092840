"""The kinds of Delta table a source table can have, and the settings' defaults for them, apart
from the code that writes them: the pipeline's settings name them, and the receiver's process
unpickles those settings without importing deltalake."""

from __future__ import annotations

import enum
from collections.abc import Collection

from pgcdc.errors import InvalidOption

# Every batch adds at least a file to each table and kind it writes (appends, a MERGE's new and
# rewritten rows), so a table a pipeline feeds for days holds thousands of small files that
# every reader and MERGE then opens. A table is compacted (delta-rs's OPTIMIZE, small files
# binned into files of up to the target size; no row changed) once it holds this many files
# under the target size (``pgcdc.sinks.delta.compact_if_fragmented``).
DEFAULT_COMPACT_FILES = 200


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


__all__ = ["DEFAULT_COMPACT_FILES", "SinkKind", "parse_kinds"]
