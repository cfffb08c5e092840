"""The output sinks on hand-built transactions: JSON value mapping, text lines, dedup, fsync."""

from __future__ import annotations

import io
import json
import math
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path

import pytest

from pgcdc.cli.outputs import JsonOutput, TextOutput, json_value, open_output_file
from pgcdc.decoding.values import BoundedList, Interval, PgDate, PgTimestamp
from pgcdc.errors import DecodeError, OutputError
from pgcdc.events import (
    UNCHANGED_TOAST,
    Column,
    EncodedRow,
    Event,
    Insert,
    Message,
    Table,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome

TABLE = Table("public", "t", (Column("id", 23, is_key=True), Column("v", 25)))


def txn(
    commit: int,
    *events: Event,
    xid: int | None = 7,
    commit_time: datetime | None = None,
    gid: str | None = None,
    outcome: TransactionOutcome = TransactionOutcome.COMMIT,
) -> CommittedTransaction:
    return CommittedTransaction(
        xid, LSN(commit), LSN(commit + 8), commit_time, events, gid=gid, outcome=outcome
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (UNCHANGED_TOAST, {"unchanged_toast": True}),
        (True, True),
        (2**63 - 1, 2**63 - 1),
        (0.1, 0.1),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        (Decimal("12.50"), "12.50"),
        (Decimal("1E-7"), "0.0000001"),
        (Decimal("NaN"), "NaN"),
        (b"\x00\xff", "\\x00ff"),
        (datetime(2024, 2, 29, 7, 4, 56, 789000, tzinfo=UTC), "2024-02-29T07:04:56.789000+00:00"),
        (date(2024, 1, 2), "2024-01-02"),
        (time(23, 59), "23:59:00"),
        (PgDate(2**31 - 1), "infinity"),
        (PgTimestamp(-(2**63), with_tz=True), "-infinity"),
        (Interval(14, 3, 4_000_000), "1 year 2 mons 3 days 00:00:04"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (LSN(0x100000010), "1/10"),
        ([1, None, [2.5, math.nan]], [1, None, [2.5, "NaN"]]),
        (BoundedList([1, 2], (0,)), "[0:1]={1,2}"),
    ],
)
def test_json_value_is_lossless_and_json_safe(value: object, expected: object) -> None:
    mapped = json_value(value)
    assert mapped == expected
    json.dumps(mapped, allow_nan=False)  # strict JSON


def test_text_lines_and_duplicates() -> None:
    stream = io.BytesIO()
    out = TextOutput(stream, fsync=True)  # a BytesIO is no regular file: never fsync'd
    message = Message(LSN(0x30), False, "p", b"\xff\n")
    assert out.append(txn(0x20, Insert(LSN(0x18), TABLE, ("1", "it's")), xid=5))
    assert out.append(txn(0x30, message, xid=None))
    assert not out.append(txn(0x30, message, xid=None))  # already there
    assert out.last_commit_lsn == LSN(0x30)
    assert out.flush() == LSN(0x38)
    assert stream.getvalue() == (
        b"BEGIN 5\ntable public.t: INSERT: id[integer]:1 v[text]:'it''s'\nCOMMIT 5\n"
        b"message: transactional: 0 prefix: p, sz: 2 content:\xff\n\n"
    )


def test_text_prepared_transactions_print_as_test_decoding() -> None:
    stream = io.BytesIO()
    out = TextOutput(stream)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    out.append(txn(0x20, xid=9, gid="g'1", outcome=TransactionOutcome.PREPARE, commit_time=when))
    out.append(txn(0x40, xid=9, gid="g'1", outcome=TransactionOutcome.COMMIT_PREPARED))
    assert stream.getvalue() == (
        b"BEGIN 9\nPREPARE TRANSACTION 'g''1', txid 9 (at 2026-01-01 00:00:00+00)\n"
        b"COMMIT PREPARED 'g''1', txid 9\n"
    )


def test_text_refuses_what_test_decoding_cannot_print() -> None:
    binary_row = Insert(LSN(0x18), TABLE, (b"\x00\x00\x00\x01", "x"))
    with pytest.raises(OutputError, match="--format json"):
        TextOutput(io.BytesIO()).append(txn(0x20, binary_row))


def test_json_key_old_and_toast() -> None:
    stream = io.BytesIO()
    out = JsonOutput(stream)
    update = Update(LSN(0x18), TABLE, ("2", UNCHANGED_TOAST), ("1", None), old_is_key=True)
    out.append(txn(0x20, update, commit_time=datetime(2026, 1, 1, tzinfo=UTC)))
    (record,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert record == {
        "operation": "update",
        "lsn": "0/18",
        "commit_lsn": "0/20",
        "end_lsn": "0/28",
        "xid": 7,
        "commit_time": "2026-01-01T00:00:00+00:00",
        "schema": "public",
        "table": "t",
        "key": {"id": 1},
        "old": {"id": 1},
        "new": {"id": 2, "v": {"unchanged_toast": True}},
    }


def test_output_file_is_appended_and_fsynced(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"before\n")
    out = TextOutput(open_output_file(str(path)))
    out.append(txn(0x20, xid=1))
    out.close()
    assert path.read_bytes() == b"before\nBEGIN 1\nCOMMIT 1\n"
    with pytest.raises(OutputError, match="could not open output file"):
        open_output_file(str(tmp_path / "missing" / "out"))


@pytest.mark.parametrize("output", [JsonOutput, TextOutput])
def test_a_malformed_row_is_a_decode_error_naming_the_change(
    output: type[JsonOutput] | type[TextOutput],
) -> None:
    """pgoutput's rows reach the outputs unchecked: the output, their consumer, refuses a
    malformed one when it reads it, writes nothing of its transaction and confirms nothing."""
    stream = io.BytesIO()
    out = output(stream)
    good = Insert(LSN(0x18), TABLE, EncodedRow.from_values(("1", "a")))
    bad = Insert(LSN(0x19), TABLE, EncodedRow(b"\x00\x02t\x00\x00\x00\x09x"))
    assert out.append(txn(0x20, good))
    written = stream.getvalue()
    with pytest.raises(DecodeError) as error:
        out.append(txn(0x30, good, bad))
    message = str(error.value)
    assert "Insert at LSN 0/19 of public.t" in message and "runs past the end" in message
    assert stream.getvalue() == written
    assert out.last_commit_lsn == LSN(0x20) and out.flush() == LSN(0x28)


@pytest.mark.parametrize("output", [JsonOutput, TextOutput])
def test_a_row_with_an_encoded_surrogate_is_a_decode_error_naming_the_change(
    output: type[JsonOutput] | type[TextOutput],
) -> None:
    """Rows are read allowing lone surrogates (the change log keeps bytes as they came); no
    UTF8 server sends one, so an output meeting one names the malformed change."""
    stream = io.BytesIO()
    out = output(stream)
    surrogate = "\ud800".encode("utf-8", "surrogatepass")
    bad = Insert(
        LSN(0x19), TABLE, EncodedRow(b"\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x03" + surrogate)
    )
    with pytest.raises(DecodeError) as error:
        out.append(txn(0x30, bad))
    message = str(error.value)
    assert "Insert at LSN 0/19 of public.t" in message and "surrogate" in message
    assert stream.getvalue() == b""
