"""The optional ``_text`` column (values the typed column cannot hold) survives every table
kind, through appends and MERGEs, and a missing ``_text`` reads as null."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.sinks.changes import TableSpec, change_schema

from .model import items_spec

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _change(op: str, ident: int, lsn: int, text: dict[str, str] | None, **values: Any) -> Any:
    row: dict[str, Any] = {"id": ident, "name": None, "body": None, "qty": None, **values}
    row.update(
        _op=op, _commit_lsn=lsn, _seq=0, _lsn=lsn, _xid=1, _commit_time=T0, _origin=None,
        _unchanged=[], _text=None if text is None else list(text.items()), _old=None,
    )  # fmt: skip
    return row


def _batch(spec: TableSpec, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=change_schema(spec))


def test_text_forms_reach_changelog_mirror_and_history(tmp_path: Path) -> None:
    spec = items_spec()
    kinds = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
    sink = DeltaSink(tmp_path, app_id="t", kinds=kinds)
    first = [
        _change("insert", 1, 0x10, {"qty": "NaN"}, name="a"),
        _change("insert", 2, 0x10, None, name="b", qty=2),
    ]
    sink.write_batch(1, [(spec, _batch(spec, first))])
    # A MERGE: row 1 gets a typed value (its text goes), row 2 gets a text form.
    second = [
        _change("update", 1, 0x20, None, name="a", qty=1),
        _change("update", 2, 0x20, {"qty": "Infinity"}, name="b"),
    ]
    sink.write_batch(2, [(spec, _batch(spec, second))])

    mirror = read_table(sink.path(spec, SinkKind.MIRROR)).sort_by("id").to_pylist()
    assert [(r["id"], r["qty"], r["_text"]) for r in mirror] == [
        (1, 1, None),
        (2, None, [("qty", "Infinity")]),
    ]
    changelog = read_table(sink.path(spec, SinkKind.CHANGELOG)).sort_by("_commit_lsn")
    texts = [(r["id"], r["_text"]) for r in changelog.to_pylist()]
    assert sorted(texts, key=str) == sorted(
        [(1, [("qty", "NaN")]), (2, None), (1, None), (2, [("qty", "Infinity")])], key=str
    )
    history = read_table(sink.path(spec, SinkKind.HISTORY)).to_pylist()
    closed = [r for r in history if not r["_is_current"] and r["id"] == 1]
    assert [r["_text"] for r in closed] == [[("qty", "NaN")]]


def test_a_change_table_without_text_reads_as_null(tmp_path: Path) -> None:
    spec = items_spec()
    rows = _batch(spec, [_change("insert", 1, 0x10, None, name="a")]).drop_columns(["_text"])
    sink = DeltaSink(tmp_path, app_id="t", kinds=(SinkKind.CHANGELOG,))
    sink.write_batch(1, [(spec, rows)])
    assert read_table(sink.path(spec, SinkKind.CHANGELOG)).column("_text").to_pylist() == [None]
