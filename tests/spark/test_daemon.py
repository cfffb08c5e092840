"""``pgcdc.spark.daemon`` and ``pgcdc.spark.local_python``: Python workers, and a local
session's planning processes, drop Spark's pyspark/py4j zips from their path only when the
installed pyspark is the zip's version (so they never run another pyspark than the JVM's), and
then import pyspark from the installed package; their streaming source runner is pgcdc's
(``pgcdc.spark.source_runner``: pyspark's, without a traceback when Spark stops it)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from pgcdc.spark.daemon import installed_instead, without_class_jars
from pgcdc.spark.local_python import choose_python, worker_python, wrapper_script
from pgcdc.spark.pipeline import spark_session
from pgcdc.spark.source_runner import PYSPARK_MODULE, closed_by_spark

ZIPS = sorted(str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))
REST = [p for p in sys.path if not p.endswith(".zip")]


def test_the_zips_leave_the_path_when_the_installed_pyspark_matches() -> None:
    assert any(z.endswith("pyspark.zip") for z in ZIPS)
    assert installed_instead([*ZIPS, *REST]) == REST
    assert installed_instead(REST) is REST


def test_the_zips_stay_for_another_pyspark_version(tmp_path: Path) -> None:
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("pyspark/version.py", '__version__: str = "0.0.1"\n')
    path = [str(other), *REST]
    assert installed_instead(path) is path


def test_jars_of_classes_leave_the_path_and_jars_with_python_stay(tmp_path: Path) -> None:
    classes, shipped = tmp_path / "classes.jar", tmp_path / "shipped.jar"
    with zipfile.ZipFile(classes, "w") as archive:
        archive.writestr("org/apache/spark/SparkContext.class", b"\xca\xfe\xba\xbe")
    with zipfile.ZipFile(shipped, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    path = [str(classes), *REST, str(shipped)]
    assert without_class_jars(path) == [*REST, str(shipped)]
    assert without_class_jars(REST) is REST
    spark_core = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    assert spark_core and without_class_jars([str(spark_core[0]), *REST]) == REST


def _jars_on_the_workers_path(spark: Any) -> list[str]:
    """The jars on ``sys.path`` of the Python workers two tasks ran in."""

    def jars(_: int) -> list[str]:
        import sys as worker_sys

        return [p for p in worker_sys.path if p.endswith(".jar")]

    return list(spark.sparkContext.parallelize([0, 1], 2).flatMap(jars).collect())


def test_workers_started_by_the_daemon_alone_leave_spark_cores_jar_off_their_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on a cluster, where no wrapper script stands in for the interpreter: the daemon
    (``spark.python.daemon.module``) takes the jar off the path of the workers it forks."""
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # kept as the user's choice
    spark = spark_session("local[1]", "pgcdc-daemon-jar-test")
    try:
        found = _jars_on_the_workers_path(spark)
    finally:
        spark.stop()
    assert found == []


def test_workers_of_a_pgcdc_session_import_the_installed_pyspark() -> None:
    spark = spark_session("local[1]", "pgcdc-daemon-test")
    try:

        def where(_: int) -> tuple[str, bool]:
            import sys as worker_sys

            import pyspark as worker_pyspark

            # The daemon imported pgcdc's read path before forking this worker.
            return str(worker_pyspark.__file__), "pgcdc.spark.source" in worker_sys.modules

        found = set(spark.sparkContext.parallelize([0, 1], 2).map(where).collect())
    finally:
        spark.stop()
    assert found == {(pyspark.__file__, True)}


def test_python_processes_of_a_local_session_leave_spark_cores_jar_off_their_path() -> None:
    """pyspark's package holds no Python in spark-core's jar, so the jar is not on the path of
    the workers or of the planning processes (each read its directory of thousands of classes
    at start and at every task's ``importlib.invalidate_caches()``)."""
    from pyspark.sql.datasource import DataSource

    class JarsOnThePath(DataSource):
        @classmethod
        def name(cls) -> str:
            return "jars_on_the_path"

        def schema(self) -> str:
            import sys as planner_sys

            jars = [p for p in planner_sys.path if p.endswith(".jar")]
            return f"`{json.dumps(jars)}` string"

    spark = spark_session("local[1]", "pgcdc-jar-off-the-path-test")
    try:
        in_workers = _jars_on_the_workers_path(spark)
        spark.dataSource.register(JarsOnThePath)
        in_planning = spark.read.format("jars_on_the_path").load().columns
    finally:
        spark.stop()
    assert in_workers == []
    assert in_planning == ["[]"]


def _python_path_through(script: Path, python_path: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if python_path is not None:
        env["PYTHONPATH"] = python_path
    shown = subprocess.run(
        [str(script), "-c", "import os; print(os.environ['PYTHONPATH'], end='')"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout


def test_the_wrapper_drops_only_the_zips(tmp_path: Path) -> None:
    zips = ["/spark home/lib/pyspark.zip", "/spark home/lib/py4j-src.zip"]
    script = tmp_path / "python"
    script.write_text(wrapper_script(sys.executable, zips))
    script.chmod(0o700)
    mixed = ":".join([zips[0], "/a b/c", zips[1], "/d*", "/spark home/lib/other.zip"])
    assert _python_path_through(script, mixed) == "/a b/c:/d*:/spark home/lib/other.zip"
    assert _python_path_through(script, ":".join(zips)) == ""
    assert _python_path_through(script, None) == ""


def test_planning_processes_of_a_local_session_import_the_installed_pyspark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.datasource import DataSource

    class WhereIsPyspark(DataSource):
        """Its schema, built in Spark's data source creation process, names that process's
        pyspark."""

        @classmethod
        def name(cls) -> str:
            return "where_is_pyspark"

        def schema(self) -> str:
            import pyspark as planner_pyspark

            return f"`{planner_pyspark.__file__}` string"

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    spark = spark_session("local[1]", "pgcdc-local-python-test")
    try:
        spark.dataSource.register(WhereIsPyspark)
        columns = spark.read.format("where_is_pyspark").load().columns
    finally:
        spark.stop()
    assert columns == [pyspark.__file__]
    assert os.environ["PYSPARK_PYTHON"] == worker_python() != sys.executable


def test_a_cluster_session_after_a_local_one_gets_this_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    choose_python(local=True)
    assert os.environ["PYSPARK_PYTHON"] == worker_python() != sys.executable
    choose_python(local=False)  # the wrapper is a temporary file of this machine only
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    choose_python(local=True)
    assert os.environ["PYSPARK_PYTHON"] == worker_python()


def test_a_python_the_user_chose_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/venv/bin/python")
    choose_python(local=True)
    choose_python(local=False)
    assert os.environ["PYSPARK_PYTHON"] == "/opt/venv/bin/python"


def test_streaming_queries_of_a_local_session_run_pgcdcs_source_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadLimit

    class Runner(DataSourceStreamReader):
        """Its offsets, computed in the streaming source runner, name the runner's module."""

        def initialOffset(self) -> dict[str, str]:  # noqa: N802 - Spark's name
            spec = sys.modules["__main__"].__spec__
            return {"runner": spec.name if spec else sys.argv[0]}

        def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, str]:  # noqa: N802
            return self.initialOffset()

        def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[InputPartition]:
            return []

        def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
            return iter(())

    class WhichRunner(DataSource):
        @classmethod
        def name(cls) -> str:
            return "which_runner"

        def schema(self) -> str:
            return "x int"

        def streamReader(self, schema: object) -> DataSourceStreamReader:  # noqa: N802
            return Runner()

    assert importlib.util.find_spec(PYSPARK_MODULE) is not None  # the module replaced exists
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    spark = spark_session("local[1]", "pgcdc-source-runner-test")
    try:
        spark.dataSource.register(WhichRunner)
        query = spark.readStream.format("which_runner").load().writeStream.format("noop").start()
        try:
            query.processAllAvailable()
            progress = query.lastProgress
        finally:
            query.stop()
    finally:
        spark.stop()
    assert progress is not None
    end = json.loads(progress["sources"][0]["endOffset"])
    assert end == {"runner": "pgcdc.spark.source_runner"}


def test_the_runner_is_quiet_only_when_spark_closed_its_socket() -> None:
    """pyspark's runner's own sequence on a real socket: a read at the socket's end (EOFError),
    then the report of it written and flushed to the closed socket (a broken pipe)."""
    from pyspark.serializers import read_int, write_int

    ours, spark_side = socket.socketpair()
    spark_side.close()
    infile, outfile = ours.makefile("rb"), ours.makefile("wb")
    try:
        try:
            try:
                read_int(infile)  # type: ignore[no-untyped-call]
            except BaseException:
                write_int(-2, outfile)  # type: ignore[no-untyped-call]
                outfile.write(b"x" * 1_000_000)  # more than the socket's buffer takes
                outfile.flush()
        finally:
            outfile.close()  # as pyspark's get_sock_file_to_executor closes it
    except OSError as error:
        reported = error
    else:
        raise AssertionError("the flush to a closed socket succeeded")
    finally:
        infile.close()
        ours.close()
    assert closed_by_spark(reported)
    # Not when the runner failed otherwise: the error reaches Spark's log as pyspark prints it.
    assert not closed_by_spark(BrokenPipeError())
    assert not closed_by_spark(EOFError())
    try:
        try:
            raise ValueError("the reader failed")
        except ValueError:
            raise BrokenPipeError  # noqa: B904 (the chain is what is tested)
    except BrokenPipeError as error:
        assert not closed_by_spark(error)


def test_the_read_path_imports_no_delta_writer() -> None:
    """Each of a query's Python processes (data source lookup, planning, the source runner, the
    workers) imports ``pgcdc.spark.source``: deltalake is for the driver's writes and the typed
    ``table=`` reads only, not an import every one of them pays."""
    program = (
        "import sys, pgcdc.spark.source; "
        "print(sorted(m for m in ('deltalake', 'pgcdc.sinks.delta') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr
