"""``pipeline.run`` with its receiver in a child process, on PG15 and PG18: the child's errors
reach the caller as their own type, a stop (event or Ctrl-C) flushes and confirms, and neither
a killed driver nor a query that fails to start leaves its receiver behind holding the slot."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.errors import (
    PgcdcError,
    PipelineQueryError,
    ReceiverProcessError,
    SlotInUse,
    portable,
)
from pgcdc.lsn import LSN
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database
from tests.processes import descendants, kill_everything, running

ROOT = Path(__file__).resolve().parents[2]


def _settings(db: Database, tmp_path: Path, **changes: Any) -> pipeline.Settings:
    settings = pipeline.Settings(
        conninfo=db.conninfo(),
        slot="proc",
        publications=("pub",),
        snapshot="never",
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        kinds=(SinkKind.CHANGELOG, SinkKind.MIRROR),
        master="local[2]",
        trigger_interval=0.5,
    )
    return pipeline.with_overrides(settings, **changes)


def _source(db: Database) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE items")


def _mirror_ids(tmp_path: Path) -> set[int]:
    mirror = tmp_path / "lake" / "public" / "items" / "mirror"
    if not (mirror / "_delta_log").exists():
        return set()
    return set(read_table(mirror).column("id").to_pylist())


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


_SLOT = "FROM pg_replication_slots WHERE slot_name = 'proc' AND database = current_database()"


def _confirmed(db: Database) -> LSN:
    return LSN.parse(db.scalar(f"SELECT confirmed_flush_lsn::text {_SLOT}"))


def _slot_active(db: Database) -> bool:
    return bool(db.scalar(f"SELECT bool_or(active) {_SLOT}"))


def _lsn(db: Database) -> LSN:
    return LSN.parse(db.scalar("SELECT pg_current_wal_lsn()::text"))


def test_portable_errors_keep_their_type_and_fields() -> None:
    error = SlotInUse("slot s is active for PID 7", slot="s", active_pid=7)
    rebuild, args = pickle.loads(pickle.dumps(portable(error)))
    copy = rebuild(*args)
    assert type(copy) is SlotInUse
    assert (str(copy), copy.slot, copy.active_pid) == (str(error), "s", 7)

    class Local(Exception):  # not importable by name: cannot be sent as itself
        pass

    rebuild, args = pickle.loads(pickle.dumps(portable(Local("boom"))))
    copy = rebuild(*args)
    assert isinstance(copy, ReceiverProcessError) and "Local: boom" in str(copy)


def test_the_receiver_process_imports_neither_spark_nor_delta(tmp_path: Path) -> None:
    """What the child imports and unpickles (its program, ``receive``, the settings with their
    table kinds) leaves pyspark and deltalake out: they only delayed the receiver's start."""
    settings = pipeline.Settings(
        conninfo="dbname=unused",
        slot="proc",
        publications=("pub",),
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        kinds=(SinkKind.CHANGELOG, SinkKind.HISTORY),
        table_kinds={"public.t": (SinkKind.MIRROR,)},
    )
    program = (
        "import pickle, sys; from pgcdc.pipeline.process import _child; "
        "from pgcdc.pipeline import receive; "
        f"settings = pickle.loads(bytes.fromhex({pickle.dumps(settings).hex()!r})); "
        "assert settings.table_kinds['public.t'][0].value == 'mirror'; "
        "print(sorted(m for m in ('pyspark', 'deltalake') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_a_receiver_error_reaches_the_caller_as_its_own_type(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    _source(db)
    # The slot exists (the driver checks that before it starts anything) but decodes with
    # another plugin: the receiver process fails as it starts streaming from it.
    db.execute("SELECT pg_create_logical_replication_slot('proc', 'test_decoding')")
    settings = _settings(db, tmp_path, create_slot=False)
    with pytest.raises(PgcdcError) as caught:
        pipeline.run(settings, once=True, spark=spark)
    assert type(caught.value) is not ReceiverProcessError, caught.value
    assert any("receiver process" in note for note in caught.value.__notes__)


def test_the_stop_event_flushes_confirms_and_ends_the_receiver(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    _source(db)
    settings = _settings(db, tmp_path)
    db.execute("SELECT pg_create_logical_replication_slot('proc', 'pgoutput')")
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            pipeline.run(settings, stop=stop, spark=spark, tick_seconds=0.2)
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=target)
    runner.start()
    try:
        db.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 500) g")
        _wait(lambda: len(_mirror_ids(tmp_path)) == 500, 120, "the mirror")
        before = _lsn(db)
        db.execute("INSERT INTO items VALUES (501, 'last')")
        _wait(lambda: _confirmed(db) > before, 60, "the receiver to confirm the last insert")
    finally:
        stop.set()
        runner.join(120)
    assert not runner.is_alive() and errors == []
    assert not _slot_active(db)
    # What the slot confirmed is in the log: the receiver flushed before it confirmed.
    with ChangeLog(settings.changelog).writer() as writer:  # its lock is free again too
        assert writer.last_commit_lsn > before


def _cli(tmp_path: Path, db: Database, *extra: str) -> subprocess.Popen[bytes]:
    output = (tmp_path / "cli.log").open("ab")
    command = [
        sys.executable, "-m", "pgcdc.cli.main", "pipeline", "run",
        "-d", db.conninfo(), "--slot", "proc", "-P", "pub", "--snapshot", "never",
        "--changelog", str(tmp_path / "log"), "--lake", str(tmp_path / "lake"),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kinds", "changelog,mirror",
        "--master", "local[2]", "--trigger-interval", "0.5", *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )


def _jvms(processes: dict[int, str]) -> list[int]:
    return [pid for pid, command in processes.items() if command.split(" ", 1)[0].endswith("java")]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # a worker that ended meanwhile
        return None


def _streaming(db: Database, tmp_path: Path) -> subprocess.Popen[bytes]:
    """``pipeline run`` (no ``--once``) whose mirror already holds the 300 rows logged."""
    _source(db)
    db.execute("SELECT pg_create_logical_replication_slot('proc', 'pgoutput')")
    db.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 300) g")
    child = _cli(tmp_path, db)
    try:
        _wait(lambda: len(_mirror_ids(tmp_path)) == 300, 180, "the mirror")
    except BaseException:
        kill_everything(child)
        raise
    return child


def test_ctrl_c_stops_driver_and_receiver_cleanly(db: Database, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the command's own processes, not Spark's JVM and its Python
    workers (in a session of their own, which pyspark's workers would answer with a traceback
    each): the command stops the query, Spark and the receiver in order."""
    child = _streaming(db, tmp_path)
    try:
        below = descendants(child.pid)
        jvms = _jvms(below)
        assert jvms, below
        spark = dict.fromkeys(jvms, "java")
        for jvm in jvms:
            spark.update(descendants(jvm))
        assert len(spark) > len(jvms), "no Python worker of Spark's found"
        in_group = {pid: c for pid, c in spark.items() if _group(pid) == child.pid}
        assert not in_group, f"Spark's processes in the terminal's process group: {in_group}"
        # A terminal's Ctrl-C: SIGINT to the whole process group, the receiver included.
        os.killpg(child.pid, signal.SIGINT)
        code = child.wait(120)
    finally:
        if child.poll() is None:
            kill_everything(child)
    # 0, as pg_recvlogical: the command's handler, not pyspark's (cancel every job, then
    # KeyboardInterrupt: 130), answers Ctrl-C, and the batch being written finishes.
    assert code == 0, (tmp_path / "cli.log").read_text()[-3000:]
    assert "Traceback" not in (tmp_path / "cli.log").read_text()
    assert not _slot_active(db)
    with ChangeLog(tmp_path / "log").writer() as writer:  # no receiver holds the log
        assert writer.last_commit_lsn > 0


# One server version (suite time): the signals are pgcdc's, the same against either server.
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_ctrl_c_again_aborts_the_stop_and_loses_nothing(db: Database, tmp_path: Path) -> None:
    """The second Ctrl-C, while the first one's stop is under way, stops without waiting for
    the batch being written (130, as for an interrupted command), still without a traceback
    and with the receiver stopped; the next start lands everything, whatever batch it cut."""
    child = _streaming(db, tmp_path)
    try:
        db.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(301, 20000) g")
        # The stop takes a second or more (the query, then Spark): the second signal lands in it.
        os.killpg(child.pid, signal.SIGINT)
        time.sleep(0.1)
        os.killpg(child.pid, signal.SIGINT)
        code = child.wait(120)
    finally:
        if child.poll() is None:
            kill_everything(child)
    output = (tmp_path / "cli.log").read_text()
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    _wait(lambda: not _slot_active(db), 30, "the receiver to let go of the slot")
    finisher = _cli(tmp_path, db, "--once")
    assert finisher.wait(180) == 0, (tmp_path / "cli.log").read_text()[-3000:]
    assert _mirror_ids(tmp_path) == set(range(1, 20001))


def test_a_killed_driver_leaves_no_receiver_behind(db: Database, tmp_path: Path) -> None:
    """Nor Spark's JVM and workers, which run in a session of their own."""
    _source(db)
    child = _cli(tmp_path, db)
    try:
        _wait(lambda: _slot_active(db), 120, "the receiver to stream")
        _wait(lambda: _jvms(descendants(child.pid)), 120, "Spark's JVM to start")
        below = descendants(child.pid)
        os.kill(child.pid, signal.SIGKILL)  # the driver only, not its process group
        child.wait()
        # The receiver sees its parent gone, lets go of the slot and of the change log.
        _wait(lambda: not _slot_active(db), 30, "the orphaned receiver to exit")
        # The JVM sees its stdin (a pipe from the driver) closed and exits, its workers too.
        _wait(lambda: not any(map(running, below)), 60, "Spark's processes to exit")
    finally:
        kill_everything(child)
    db.execute("INSERT INTO items VALUES (1, 'after')")
    finisher = _cli(tmp_path, db, "--once")
    assert finisher.wait(180) == 0, (tmp_path / "cli.log").read_text()[-3000:]
    assert _mirror_ids(tmp_path) == {1}


def test_a_query_that_fails_to_start_stops_the_receiver(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    _source(db)
    db.execute("SELECT pg_create_logical_replication_slot('proc', 'pgoutput')")
    (tmp_path / "checkpoint").write_text("a file where the checkpoint folder must go")
    settings = _settings(db, tmp_path)
    with pytest.raises(PipelineQueryError, match=r"could not start: .*not a directory") as caught:
        pipeline.run(settings, spark=spark)
    # The receiver (started first) let go of the slot and of the change log.
    assert not _slot_active(db), caught.value
    with ChangeLog(settings.changelog).writer():
        pass
