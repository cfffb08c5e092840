"""ReceiverOptions.session_settings: pgcdc's ISO/UTC settings by default, the server's own
settings with None, any given settings otherwise; bad names are a typed error (PG15/PG18)."""

from __future__ import annotations

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
        "-c DateStyle=ISO -c IntervalStyle=postgres -c TimeZone=UTC"
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
