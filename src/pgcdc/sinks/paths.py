"""Where a source table's Delta tables live: ``<lake>/<segment(schema)>/<segment(table)>/<kind>``.

PostgreSQL names may hold any character but NUL (``..``, ``a/b``, ``Upper Case``, ``%20``,
``é``, names differing only in case), while a lake path segment must stay inside the lake and
mean the same to the local filesystem, delta-rs (which reads some paths as URLs, so ``%20``
would become a space) and object stores. ``segment`` maps a name to a segment made only of
``[a-z0-9_-]``:

* the characters ``a-z``, ``0-9`` and ``_`` stand for themselves, so ordinary lower-case
  names keep the path they always had;
* every other character becomes ``-`` followed by the two lower-case hex digits of each of
  its UTF-8 bytes (``Upper Case`` -> ``-55pper-20-43ase``, ``..`` -> ``-2e-2e``,
  ``-`` itself -> ``-2d``).

Each ``-`` starts exactly one escape, so the mapping is injective (``name_of`` inverts it), a
segment is never ``.``, ``..`` or empty and holds no ``/``, ``%``, ``=`` or upper-case letter
(distinct names stay distinct on case-insensitive filesystems). A 63-byte name gives at most
189 characters, under the usual 255-byte limit of a file name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pgcdc.errors import LakePathError

if TYPE_CHECKING:
    from pathlib import Path

    from pgcdc.sinks.kinds import SinkKind

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_ESCAPE = "-"
_SEGMENT = re.compile(r"(?:[a-z0-9_]|-[0-9a-f]{2})+")
# What ``urllib.parse.quote(name, safe="")`` left alone: the mapping before this one.
_LEGACY = re.compile(r"[A-Za-z0-9_.~-]+")


def segment(name: str) -> str:
    """The lake path segment of a schema or table name (see the module docstring)."""
    if not name:
        raise LakePathError(
            "an empty schema or table name has no lake path; PostgreSQL names are never empty, "
            "so the change batch naming it is wrong"
        )
    if all(ch in _PLAIN for ch in name):
        return name
    try:
        return "".join(
            ch if ch in _PLAIN else "".join(f"{_ESCAPE}{b:02x}" for b in ch.encode("utf-8"))
            for ch in name
        )
    except UnicodeEncodeError as exc:
        raise LakePathError(
            f"the name {name!r} is not valid UTF-8 text ({exc}), so it has no lake path; "
            "connect with client_encoding UTF8"
        ) from None


def name_of(text: str) -> str:
    """The schema or table name whose ``segment`` is ``text``."""
    if not _SEGMENT.fullmatch(text):
        raise LakePathError(
            f"{text!r} is not a pgcdc lake path segment: those hold only a-z, 0-9, _ and "
            "- followed by two lower-case hex digits"
        )
    data = bytearray()
    index = 0
    while index < len(text):
        if text[index] == _ESCAPE:
            data.append(int(text[index + 1 : index + 3], 16))
            index += 3
        else:
            data += text[index].encode("ascii")
            index += 1
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LakePathError(
            f"{text!r} is not a pgcdc lake path segment: its escapes are not UTF-8 ({exc})"
        ) from None


def table_path(lake: str | Path, namespace: str, name: str, kind: SinkKind) -> str:
    """The path of the ``kind`` Delta table of source table ``namespace.name`` under ``lake``
    (a local path or a URI), the one every writer and reader of the lake uses."""
    return "/".join((str(lake).rstrip("/"), segment(namespace), segment(name), kind.value))


def legacy_table_path(lake: str | Path, namespace: str, name: str, kind: SinkKind) -> str | None:
    """Where pgcdc before this mapping put the table, when that differs from ``table_path`` and
    could have held a table (it URL-quoted names: ``Orders`` stayed ``Orders``; a quoted name
    holding ``%`` could never be opened again, and ``..`` left the lake)."""
    parts = []
    for part in (namespace, name):
        if not _LEGACY.fullmatch(part) or part in (".", ".."):
            return None
        parts.append(part)
    old = "/".join((str(lake).rstrip("/"), *parts, kind.value))
    return None if old == table_path(lake, namespace, name, kind) else old
