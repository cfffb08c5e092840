"""The receiver's memory stays under its cap however large a transaction is (README: one
streamed transaction, peak RSS < 256 MB).

One transaction of rows whose values alone weigh more than the cap is streamed by the server
(pgoutput protocol 2, ``streaming`` on) to a receiver in a child process; its peak RSS
(VmHWM) must stay under 256 MB, and the log must hold every row with the source's values.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.changelog.codec import decode_rows
from pgcdc.events import Insert
from tests.conftest import Database

REPO = Path(__file__).resolve().parents[2]
CAP_MB = 256
ROWS = 250_000
WIDTH = 34 * 32  # characters of each row's text: ROWS * WIDTH is more than the cap


@pytest.mark.slow
def test_one_huge_transaction_stays_under_the_memory_cap(db: Database, tmp_path: Path) -> None:
    assert ROWS * WIDTH > CAP_MB << 20
    with db.connect() as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, note text, n int)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('big', 'pgoutput')")
        conn.execute(
            "INSERT INTO big SELECT g, repeat(md5(g::text), 34), g %% 1000 "
            "FROM generate_series(1, %s::bigint) g",
            (ROWS,),
        )
    end = db.scalar("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    root = tmp_path / "log"
    command = [sys.executable, "-m", "tests.changelog.memory_child", db.conninfo()]
    result = subprocess.run(
        [*command, str(int(end)), str(root), str(CAP_MB)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = dict(line.split() for line in result.stdout.splitlines())
    print(f"receiver peak RSS {figures['peak']} MiB")
    assert int(figures["changes"]) == ROWS
    assert float(figures["peak"]) < CAP_MB, figures

    # Every row, in order, with the source's values; all in one transaction.
    log = ChangeLog(root)
    commits = set()

    def logged() -> Iterator[tuple[object, ...]]:
        for info in log.segments():
            for batch in log.read_segment(info.path):
                for row in decode_rows(batch):
                    commits.add(row.commit_lsn)
                    if isinstance(row.event, Insert):
                        yield tuple(row.event.new)

    count = 0
    with db.connect() as conn, conn.transaction(), conn.cursor(name="source") as cursor:
        cursor.itersize = 10_000
        cursor.execute("SELECT id::text, note, n::text FROM big ORDER BY big.id")
        for got, want in zip_longest(logged(), cursor):
            assert got == want
            count += 1
    assert count == ROWS and len(commits) == 1
