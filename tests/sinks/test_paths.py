"""Names to lake path segments (``pgcdc.sinks.paths``): injective, inside the lake, unchanged for
plain lower-case names, and a table left at the path an older pgcdc used is refused, not forked."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pgcdc.errors import LakePathError
from pgcdc.sinks import DeltaSink, SinkKind, read_table, table_path, write_table
from pgcdc.sinks.paths import name_of, segment

from .model import Source, items_spec

# Every name PostgreSQL allows: any characters but NUL, 1 to 63 bytes.
names = (
    st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=63
    )
    .map(lambda n: n.encode("utf-8")[:63].decode("utf-8", "ignore"))
    .filter(bool)
)

EXAMPLES = [
    "..",
    ".",
    "...",
    ".hidden",
    "a/b",
    "/",
    "Upper Case",
    "upper case",
    "%20",
    " ",
    '"q"',
    "é",
    "e\u0301",  # é decomposed: another name, another segment
    "Items",
    "items",
    "ITEMS",
    "-55pper",  # what "Upper" escapes to, as a name of its own
    "-2e-2e",
    "a-b",
    "a=b",
    "_delta_log",
    "x" * 63,
    "日本語のテーブル名",
    "\\",
    "~",
]


def _safe(text: str) -> None:
    assert re.fullmatch(r"[a-z0-9_-]+", text), text
    assert text not in (".", "..")
    assert len(text.encode()) <= 255
    lake = "/lake"
    assert os.path.dirname(os.path.normpath(os.path.join(lake, text))) == lake


@given(names)
@example("..")
@example("Upper Case")
def test_every_name_maps_to_a_safe_segment_that_maps_back(name: str) -> None:
    text = segment(name)
    _safe(text)
    assert name_of(text) == name


@given(names)
@example("Items")
@example("ǅ")  # a title-case letter: upper, lower and swapped case all differ
def test_names_differing_only_in_case_stay_apart_on_case_insensitive_filesystems(
    name: str,
) -> None:
    variants = {name, name.lower(), name.upper(), name.swapcase(), name.casefold()}
    variants = {v for v in variants if 0 < len(v.encode()) <= 63}
    assert len({segment(v).casefold() for v in variants}) == len(variants)


def test_explicit_names_are_distinct_and_safe() -> None:
    segments = [segment(n) for n in EXAMPLES]
    for text in segments:
        _safe(text)
    assert len({s.casefold() for s in segments}) == len(EXAMPLES)
    assert [name_of(s) for s in segments] == EXAMPLES
    assert segment("Upper Case") == "-55pper-20-43ase"
    assert segment("..") == "-2e-2e"
    assert segment("-55pper") == "-2d55pper"


@given(st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789_"), min_size=1, max_size=63))
@example("orders")
@example("_pgcdc")
def test_plain_lower_case_names_keep_the_path_they_had(name: str) -> None:
    assert segment(name) == name == quote(name, safe="")


def test_the_table_path_joins_the_segments() -> None:
    spec = replace(items_spec(), namespace="..", name="a/b")
    path = table_path("s3://bucket/lake/", spec.namespace, spec.name, SinkKind.MIRROR)
    assert path == "s3://bucket/lake/-2e-2e/a-2fb/mirror"
    assert DeltaSink("s3://bucket/lake", app_id="a").path(spec, SinkKind.MIRROR) == path


@pytest.mark.parametrize("text", ["", "A", "-", "-2", "-2G", "a.b", "a/b", "-ff", "%20"])
def test_what_is_not_a_segment_is_refused(text: str) -> None:
    with pytest.raises(LakePathError):
        name_of(text)


def test_an_empty_name_or_one_utf_8_cannot_hold_is_refused() -> None:
    with pytest.raises(LakePathError, match="empty"):
        segment("")
    with pytest.raises(LakePathError, match="UTF-8"):
        segment("a\udcffb")


def test_a_table_at_its_old_path_is_refused_with_the_move_to_make(tmp_path: Path) -> None:
    """``Orders`` used to live at ``public/Orders``; writing on at the new path would start an
    empty mirror beside the old one, so the sink stops and says what to move."""
    src = Source(replace(items_spec(), name="Orders"))
    src.insert(id=1, name="a", body="x", qty=1)
    src.commit()
    old = tmp_path / "public" / "Orders" / "mirror"
    write_table(old, src.spec, src.take(), SinkKind.MIRROR, app_id="app", version=1)
    sink = DeltaSink(tmp_path, app_id="app", kinds=[SinkKind.MIRROR])
    new = sink.path(src.spec, SinkKind.MIRROR)
    assert new == str(tmp_path / "public" / "-4frders" / "mirror")
    src.insert(id=2, name="b", body="y", qty=2)
    src.commit()
    batch = src.take()
    with pytest.raises(LakePathError, match=re.escape(f"move {old} to {new}")):
        sink.write_batch(2, [(src.spec, batch)])
    assert not Path(new).exists()
    Path(new).parent.mkdir(parents=True)
    shutil.move(old, new)
    sink.write_batch(2, [(src.spec, batch)])
    rows = read_table(new).sort_by("id").select(["id", "name"]).to_pylist()
    assert rows == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
