"""A class archive for the local driver JVM: the classes Spark loads, parsed and verified once,
then mapped from one file by every later local session (HotSpot's application class-data
sharing).

A local session's JVM loads and verifies some twenty thousand classes from Spark's jars before
its first query, and more as a streaming query starts: CPU on the critical path of a run, on a
machine whose other core the receiver needs. An archive made by one session and mapped by the
next cuts both (figures in docs/pipeline.md).

A damaged archive crashes the JVM that maps it (a truncated one with SIGBUS), so an archive is
only ever written under a temporary name, by a JVM of its own that must exit cleanly, then
mapped once with ``-Xshare:on`` (which refuses what it cannot use), and only then renamed into
place. The archive's name holds a digest of the java binary and Spark's jars, so an upgrade of
either is a new archive; a JVM that cannot use an archive starts without it, quietly.

``python -m pgcdc.spark.class_archive`` makes the archive if there is none (``scripts/setup``
does); ``PGCDC_CACHE_DIR`` chooses its folder (default ``$XDG_CACHE_HOME/pgcdc`` or
``~/.cache/pgcdc``); ``PGCDC_CLASS_ARCHIVE=0`` keeps sessions from using one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from pgcdc.spark.local_python import spark_home

# Applied to every local driver JVM (pgcdc.spark.pipeline.spark_session): C1 only, as C2 spent
# seconds of CPU per run compiling code that mostly copies bytes.
BASE_OPTIONS: Final = ("-XX:TieredStopAtLevel=1",)
# The JVM's notes about archives it cannot use (or classes it cannot archive) are not the
# user's concern: a session without the archive works, only slower.
_QUIET: Final = "-Xlog:cds*=off"
_PREFIX: Final = "spark-classes-"
_KEEP_OTHERS: Final = 2


def cache_dir() -> Path:
    given = os.environ.get("PGCDC_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgcdc"


def _java() -> Path | None:
    """The java Spark's launcher runs (``bin/spark-class``: ``$JAVA_HOME/bin/java``, else the
    one on ``PATH``)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def archive_key() -> str | None:
    """A digest of what the archive depends on: the java binary and its libjvm, and Spark's
    jars (names, sizes, times). None without a java or jars to digest."""
    java = _java()
    jars = spark_home() / "jars"
    if java is None or not jars.is_dir():
        return None
    digest = hashlib.sha256()
    libjvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    for path in (java, libjvm):
        if path.exists():
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for jar in sorted(jars.iterdir()):
        stat = jar.stat()
        digest.update(f"{jar.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def archive_path() -> Path | None:
    key = archive_key()
    return cache_dir() / f"{_PREFIX}{key}.jsa" if key else None


def driver_options() -> tuple[str, ...]:
    """The local driver JVM's options: ``BASE_OPTIONS``, and the archive when there is one."""
    if os.environ.get("PGCDC_CLASS_ARCHIVE", "1") == "0":
        return BASE_OPTIONS
    path = archive_path()
    if path is None or not path.is_file():
        return BASE_OPTIONS
    return (*BASE_OPTIONS, f"-XX:SharedArchiveFile={path}", _QUIET)


def _session_in_child(mode: str, archive: Path, timeout: float) -> bool:
    """Run ``mode`` (``train`` or ``check``) in a Python process of its own; True when it and
    its JVM exited cleanly."""
    # In a folder of its own: a JVM that crashes on an archive writes its report (hs_err_PID.log)
    # where it runs.
    with tempfile.TemporaryDirectory(prefix="pgcdc-class-archive-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pgcdc.spark.class_archive", mode, str(archive.resolve())],
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def build(timeout: float = 600.0) -> Path | None:
    """Make the archive unless it exists; return its path, or None when this JVM cannot make
    one (no java, a JVM without class-data sharing, a session that failed)."""
    path = archive_path()
    if path is None:
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # the JVM writes it anew
    try:
        if not _session_in_child("train", partial, timeout) or not partial.is_file():
            return None
        if not _session_in_child("check", partial, timeout):
            return None
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    # Archives of other javas or Sparks: one may be another environment's (kept, or the two
    # would remove each other's); older ones are most likely of versions since replaced.
    others = sorted(
        (p for p in path.parent.glob(f"{_PREFIX}*.jsa") if p != path),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in others[_KEEP_OTHERS:]:
        stale.unlink(missing_ok=True)
    return path


def _run_session(java_options: str) -> int:
    """Start a local session with ``java_options``, load what a pipeline's session loads
    (SQL, Arrow in and out, a Python worker), stop it and wait for its JVM to exit: the
    archive is written as the JVM exits, and its exit code says whether it got there."""
    from pyspark import SparkContext

    from pgcdc.spark.pipeline import spark_session

    spark = spark_session(
        "local[2]",
        "pgcdc-class-archive",
        **{"spark.driver.extraJavaOptions": java_options, "spark.ui.showConsoleProgress": "false"},
    )
    frame = spark.range(1000).selectExpr("id", "cast(id AS string) AS text", "id * 2 AS twice")
    assert spark.createDataFrame(frame.toArrow()).count() == 1000
    with tempfile.TemporaryDirectory() as empty:
        assert spark.read.format("pgcdc").option("path", empty).load().count() == 0
    spark.stop()
    gateway = SparkContext._gateway
    assert gateway is not None
    process = gateway.proc
    assert process.stdin is not None
    process.stdin.close()  # the JVM exits at its stdin's end
    return int(process.wait())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["train"]:
        return _run_session(f"{' '.join(BASE_OPTIONS)} -XX:ArchiveClassesAtExit={args[1]} {_QUIET}")
    if args[:1] == ["check"]:
        return _run_session(f"{' '.join(BASE_OPTIONS)} -Xshare:on -XX:SharedArchiveFile={args[1]}")
    path = build()
    if path is None:
        print("pgcdc: no class archive for Spark's driver: this java cannot make one or Spark's "
              "session failed; sessions start without it", file=sys.stderr)  # fmt: skip
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
