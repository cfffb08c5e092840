"""``pgcdc.spark.fork_server`` and its client: a local session's Python processes are children
forked from one interpreter that imported pyspark and pgcdc once, and each is the process
``python -m MODULE`` would have been (arguments, streams, environment, exit status, signals);
a request the server cannot answer that way starts its own interpreter."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pgcdc.spark import fork_client, fork_server
from pgcdc.spark.local_python import PYTHON_VARIABLES

PROBE = '''
"""Reports what it runs as; then exits with its first argument, or sleeps until SIGTERM."""
import json, os, signal, sys, time
if sys.argv[1] == "sleep":  # before it reports, so a signal sent after its report finds it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))
print(json.dumps({
    "argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
    "main": sys.modules["__main__"].__spec__.name, "runtime": os.environ.get("SPARK_PROBE"),
    "stdin": sys.stdin.readline().strip(), "preloaded": "pyspark.worker" in sys.modules,
}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
'''


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _exit_code(server: fork_server.ForkServer, seconds: float) -> int | None:
    """The server's exit code once it ends within ``seconds``; None if it still runs."""
    deadline = time.monotonic() + seconds
    while True:
        pid, status = os.waitpid(server.pid, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


Server = tuple[fork_server.ForkServer, str, dict[str, str]]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A fork server whose path holds the probe module, and the environment it runs with."""
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "probe.py").write_text(textwrap.dedent(PROBE))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "modules")}
    sock = str(tmp_path / "fork.sock")
    process = fork_server.start(sock, env)
    try:
        _wait(lambda: os.path.exists(sock), 60, "the fork server to listen")
        yield process, sock, env
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(process.pid, signal.SIGKILL)
            os.waitpid(process.pid, 0)
        process.stop()


def _client(sock: str, env: dict[str, str], *args: str, **popen: object) -> subprocess.Popen[str]:
    command = [sys.executable, "-I", "-S", fork_client.__file__, sock, sys.executable, *args]
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        command,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _started(client: subprocess.Popen[str]) -> int:
    """The pid of a sleeping probe, once it reported."""
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write("x\n")
    client.stdin.flush()
    pid: int = json.loads(client.stdout.readline())["pid"]
    return pid


def test_a_child_is_the_process_python_would_have_been(
    server: Server,
) -> None:
    process, sock, env = server
    # SPARK_*: set by Spark per process; PWD: kept by the wrapper script's shell; an Arrow
    # allocator; the same path with an entry repeated (as Spark gives the data source lookup).
    runtime = {
        "SPARK_PROBE": "per process",
        "PWD": "/elsewhere",
        "ARROW_DEFAULT_MEMORY_POOL": "jemalloc",
        "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], "", env["PYTHONPATH"]]),
    }
    client = _client(sock, {**env, **runtime}, "-m", "probe", "7")
    out, err = client.communicate("hello\n", timeout=60)
    assert client.returncode == 7, err
    shown = json.loads(out)
    assert shown["ppid"] == process.pid  # forked by the server, not started by the client
    assert shown["preloaded"]  # what the server imported came with it
    assert shown["main"] == "probe"
    assert shown["argv"][1:] == ["7"] and shown["argv"][0].endswith("probe.py")
    assert shown["cwd"] == os.getcwd()
    assert shown["runtime"] == "per process"  # a per-process variable: the request's value
    assert shown["stdin"] == "hello"  # the client's standard streams
    assert err == "to stderr\n"


@pytest.mark.parametrize(
    "differs",
    [
        pytest.param({"PGCDC_SOMETHING": "1"}, id="environment"),
        pytest.param({"PYTHONHASHSEED": "12345"}, id="hash-seed"),
        pytest.param({"PYTHONPATH": "/elsewhere"}, id="path"),
    ],
)
def test_a_request_the_server_cannot_fork_starts_its_own_interpreter(
    server: Server, differs: dict[str, str]
) -> None:
    _process, sock, env = server
    if "PYTHONPATH" in differs:  # another path that still finds the probe
        differs = {"PYTHONPATH": os.pathsep.join([differs["PYTHONPATH"], env["PYTHONPATH"]])}
    env = {**env, **differs}
    client = _client(sock, env, "-m", "probe", "3")
    out, err = client.communicate("hi\n", timeout=60)
    assert client.returncode == 3, err
    shown = json.loads(out)
    assert shown["pid"] == client.pid and shown["ppid"] == os.getpid()  # the client exec'd
    assert not shown["preloaded"]
    assert shown["stdin"] == "hi"


@pytest.mark.parametrize("ending", ["terminated", "killed"])
def test_the_child_ends_with_its_client(server: Server, ending: str) -> None:
    """Spark's SIGTERM to the client reaches the child, whose exit is then the client's; a
    SIGKILLed client (nothing to relay) has the server terminate its child."""
    process, sock, env = server
    with _client(sock, env, "-m", "probe", "sleep") as client:
        child = _started(client)
        if ending == "terminated":
            client.send_signal(signal.SIGTERM)
            assert client.wait(30) == 5  # the child's handler answered it
        else:
            client.kill()
    _wait(lambda: not Path(f"/proc/{child}").exists(), 10, "the server to reap the child")
    after = _client(sock, env, "-m", "probe", "0")  # the server serves on
    out, _err = after.communicate("z\n", timeout=60)
    assert after.returncode == 0 and json.loads(out)["ppid"] == process.pid


def test_the_server_stops_taking_requests_when_its_driver_goes_and_outlives_its_children(
    server: Server,
) -> None:
    process, sock, env = server
    with _client(sock, env, "-m", "probe", "sleep") as sleeper:
        child = _started(sleeper)
        process.stop()  # the driver is gone
        _wait(lambda: not os.path.exists(sock), 10, "the socket to go")
        late = _client(sock, env, "-m", "probe", "0")
        out, _err = late.communicate("y\n", timeout=60)
        assert late.returncode == 0 and json.loads(out)["ppid"] == os.getpid()
        assert _exit_code(process, 0) is None  # it still owes the sleeper its status
        os.kill(child, signal.SIGUSR1)  # default action: the child ends by the signal
        assert sleeper.wait(30) == -signal.SIGUSR1
    assert _exit_code(process, 10) == 0


def test_every_python_process_of_a_local_query_is_forked(tmp_path: Path) -> None:
    """In a fresh driver: the data source lookup, its creation, read planning, the streaming
    source runner and the workers' daemon all come from the fork server."""
    program = textwrap.dedent(
        """
        import json, os, sys, time
        from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
        from pgcdc.spark import local_python
        from pgcdc.spark.pipeline import spark_session

        def parent(pid):
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])

        def forked():  # by the server, or by a pyspark daemon the server forked
            with open(f"/proc/{parent(os.getpid())}/cmdline", "rb") as cmdline:
                return b"pgcdc.spark.fork_server" in cmdline.read()

        class Part(InputPartition):
            def __init__(self, forked):
                self.forked = forked

        class Reader(DataSourceStreamReader):
            def initialOffset(self):
                return {"at": 0}
            def latestOffset(self, start, limit):
                return {"at": 1}
            def partitions(self, start, end):
                return [Part(forked())] if end["at"] > start["at"] else []
            def read(self, partition):
                yield (partition.forked, forked(), 0)

        class Probe(DataSource):
            @classmethod
            def name(cls):
                return "probe"
            def schema(self):
                return f"runner boolean, task boolean, created_{str(forked()).lower()} int"
            def streamReader(self, schema):
                return Reader()

        spark = spark_session("local[1]", "fork-server-test")
        assert len(local_python._fork_servers) == 1
        sock = os.path.join(os.path.dirname(local_python.worker_python()), "fork.sock")
        while not os.path.exists(sock):  # it imports while the JVM starts: nearly always ready
            time.sleep(0.05)
        spark.dataSource.register(Probe)
        seen = []
        frame = spark.readStream.format("probe").option("o", "1").load()
        query = frame.writeStream.foreachBatch(lambda df, _: seen.extend(df.collect())).start()
        query.processAllAvailable()
        jvm = spark.sparkContext._gateway.proc.pid
        spark_pythons = []  # the JVM's Python processes: what Spark started and talks to
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and parent(int(pid)) == jvm:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        args = cmdline.read().decode().split("\\0")
                    if args != [""]:  # not a process that exited and awaits its reaping
                        spark_pythons.append(args)
            except OSError:
                pass
        query.stop()
        print(json.dumps({"columns": frame.columns, "rows": [list(r) for r in seen],
                          "spark_pythons": spark_pythons}))
        spark.stop()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        # As a fresh command: not this process's wrapper script, which an earlier session of
        # this process put in both variables (its fork server would decline, rightly).
        env={k: v for k, v in os.environ.items() if k not in PYTHON_VARIABLES},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]  # runpy's, for one
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert "created_true" in shown["columns"], shown
    # The session's data source lookup too (PYSPARK_DRIVER_PYTHON), at session start.
    clients = [c for c in shown["spark_pythons"] if fork_client.__file__ in c]
    assert clients == shown["spark_pythons"], shown
    modules = {[arg for arg in c if arg][-1] for c in clients}  # cmdline ends with a NUL
    assert "pyspark.sql.worker.lookup_data_sources" in modules, shown
    assert shown["rows"] == [[True, True, 0]], shown
