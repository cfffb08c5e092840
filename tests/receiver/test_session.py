"""ReceiverOptions.session_settings: pgcdc's ISO/UTC settings by default, the server's own
settings with None, any given settings otherwise; bad names are a typed error (PG15/PG18)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.errors import InvalidOption
from pgcdc.receiver import DEFAULT_SESSION_SETTINGS, Receiver, ReceiverOptions, session_options
from tests.conftest import Database

from .helpers import current_lsn, logged_facts


def _logged_time(db: Database, tmp_path: Path, settings: object) -> object:
    """The text the receiver logs for one timestamptz under ``settings`` (a fresh slot)."""
    number = int(db.scalar("SELECT count(*) FROM times")) + 1
    slot = f"s{number}"
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    db.execute(f"INSERT INTO times VALUES ({number}, '2024-02-29 23:30:00+00')")
    with db.connect() as conn:
        end = current_lsn(conn)
    kwargs = {} if settings is DEFAULT_SESSION_SETTINGS else {"session_settings": settings}
    options = ReceiverOptions(
        db.conninfo(),
        slot,
        publications=("pub",),
        end_lsn=end,
        **kwargs,  # type: ignore[arg-type]
    )
    root = tmp_path / slot
    with ChangeLog(root).writer() as sink:
        Receiver(options, sink).run()
    [(_, changes)] = logged_facts(root)
    [(_, _, row)] = changes
    return row[1]


def test_settings_default_none_and_given(db: Database, tmp_path: Path) -> None:
    name = db.scalar("SELECT current_database()")
    db.execute(f"ALTER DATABASE \"{name}\" SET TimeZone = 'Asia/Tokyo'")
    db.execute("CREATE TABLE times (id int PRIMARY KEY, t timestamptz)")
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    assert _logged_time(db, tmp_path, DEFAULT_SESSION_SETTINGS) == "2024-02-29 23:30:00+00"
    assert _logged_time(db, tmp_path, None) == "2024-03-01 08:30:00+09"  # the database's zone
    assert _logged_time(db, tmp_path, {}) == "2024-03-01 08:30:00+09"
    given = {"TimeZone": "America/New_York", "DateStyle": "ISO"}
    assert _logged_time(db, tmp_path, given) == "2024-02-29 18:30:00-05"


def test_session_options_escape_values() -> None:
    assert session_options("dbname=x", {"search_path": "a b\\c"}) == r"-c search_path=a\ b\\c"
    assert session_options("dbname=x", None) == ""
    assert session_options("dbname=x") == (
        "-c DateStyle=ISO -c IntervalStyle=postgres -c TimeZone=UTC -c extra_float_digits=3 "
        "-c bytea_output=hex"
    )


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"Time Zone": "UTC"}, "not a configuration parameter name"),
        ({"TimeZone": 5}, "must be a string"),
        ({"TimeZone": "U\0TC"}, "without NUL"),
    ],
)
def test_bad_settings_are_a_typed_error(settings: dict[str, object], complaint: str) -> None:
    with pytest.raises(InvalidOption, match=complaint):
        ReceiverOptions("dbname=x", "s", publications=("p",), session_settings=settings)  # type: ignore[arg-type]


# Database defaults that each change a type's text output; the receiver, the snapshot and the
# SQL interface must not let any of them alter a value.
_HOSTILE_DEFAULTS = {
    "extra_float_digits": "0",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "TimeZone": "America/St_Johns",  # LMT offset -03:30:52 before 1935
    "bytea_output": "escape",
}
_COLUMNS = ("f4", "f8", "d", "ts", "tz", "iv", "b", "m")
_ROW = (
    "%s, 3.1415927::float4, 2.718281828459045::float8, '2024-02-29', "
    "'2024-02-29 23:30:00.123456', '1900-01-01 12:00:00.5+00', "
    "'1 year 2 mons -3 days 04:05:06.789', '\\x00ff5c27'::bytea, 1234.56"
)


def _as_held(db: Database) -> dict[int, tuple[str, ...]]:
    """Each row's values as text in a session of our own: ISO, UTC, exact floats, hex."""
    forced = (
        "-c DateStyle=ISO -c IntervalStyle=postgres -c TimeZone=UTC -c extra_float_digits=3 "
        "-c bytea_output=hex"
    )
    with db.connect(options=forced) as conn:
        rows = conn.execute(
            f"SELECT id, {', '.join(f'{c}::text' for c in _COLUMNS)} FROM vals ORDER BY id"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def test_database_defaults_do_not_alter_values(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgcdc.cli.main import main
    from pgcdc.snapshot import take_snapshot

    for name, value in _HOSTILE_DEFAULTS.items():
        db.execute(f"ALTER DATABASE \"{db.name}\" SET {name} = '{value}'")
    db.execute(
        "CREATE TABLE vals (id int PRIMARY KEY, f4 float4, f8 float8, d date, ts timestamp, "
        "tz timestamptz, iv interval, b bytea, m money)"
    )
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    db.execute(f"INSERT INTO vals VALUES ({_ROW % 1})")
    with db.connect() as conn:  # the hostile defaults are in force in a plain session
        assert conn.execute("SELECT f4::text FROM vals").fetchone() == ("3.14159",)
    # A user's own options are kept (application_name is not ours) and ours still win.
    conninfo = db.conninfo(options="-c extra_float_digits=-2 -c application_name=mine")
    with ChangeLog(tmp_path).writer() as sink:
        # The text copy: binary values owe nothing to these settings.
        take_snapshot(conninfo, slot="s", sink=sink, publications=("pub",), copy_format="text")
        db.execute(f"INSERT INTO vals VALUES ({_ROW % 2})")
        with db.connect() as conn:
            end = current_lsn(conn)
        Receiver(ReceiverOptions(conninfo, "s", publications=("pub",), end_lsn=end), sink).run()
    held = _as_held(db)
    logged = {row[0]: row[1:] for _, changes in logged_facts(tmp_path) for _, _, row in changes}
    assert sorted(logged) == ["1", "2"]  # 1 from the snapshot, 2 from the stream
    for key, values in logged.items():
        for column, got, want in zip(_COLUMNS, values, held[int(key)], strict=True):
            assert (column, got) == (column, want)
    assert held[1][0] == "3.1415927" and held[1][4] == "1900-01-01 12:00:00.5+00"
    # The SQL interface (pgcdc peek) prints them as held too.
    db.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    db.execute(f"INSERT INTO vals VALUES ({_ROW % 3})")
    assert main(["peek", "-d", conninfo, "-S", "td", "-o", "include-xids=0"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if "INSERT" in line]
    held = _as_held(db)
    for column, value in zip(_COLUMNS, held[3], strict=True):
        shown = value if column in ("f4", "f8") else f"'{value}'"
        assert re.search(rf" {column}\[[^\]]+\]:{re.escape(shown)}( |$)", line), (column, line)
