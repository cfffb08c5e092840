"""A Spark standalone cluster for the tests: a master and workers started from the installed
pyspark's ``spark-class``, each a JVM of its own in its own process group.

Local masters (``local[N]``) run tasks in the driver's JVM and its Python workers; a
standalone cluster runs them in executors the worker JVMs start, with Python workers of their
own: the process tree users deploy, which ``local[N]`` never exercises.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on now (bound to 0, then released)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def spark_class() -> Path:
    """``bin/spark-class`` of the pyspark this interpreter imports (no SPARK_HOME needed)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def java_missing() -> str | None:
    """Why Spark cannot start here, or None: the only reason the cluster tests may skip."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return None
    if shutil.which("java"):
        return None
    return "no Java (neither JAVA_HOME nor java on PATH): Spark cannot start"


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``url`` is the ``spark://`` master URL."""

    url: str
    webui: str
    work_dir: Path
    log_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """Kill every process group (master, workers, the executors and Python workers they
        started) and wait for the JVMs to exit."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def standalone_cluster(
    folder: Path,
    workers: int = 2,
    memory: str = "1g",
    timeout: float = 90,
    env: Mapping[str, str] | None = None,
) -> Iterator[StandaloneCluster]:
    """Start a master and ``workers`` one-core workers on loopback, wait until every worker
    registered, and stop them all on exit. ``env`` is added to the JVMs' environment, which
    their executors and Python workers inherit (not the driver's)."""
    folder.mkdir(parents=True, exist_ok=True)
    work_dir = folder / "work"
    log_dir = folder / "logs"
    work_dir.mkdir(exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": HOST,
        "SPARK_WORKER_DIR": str(work_dir),
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_NO_DAEMONIZE": "1",
        **(env or {}),
    }
    # A SPARK_HOME naming another Spark would make spark-class run that Spark's jars.
    env.pop("SPARK_HOME", None)
    port, webui = free_port(), free_port()
    cluster = StandaloneCluster(
        url=f"spark://{HOST}:{port}",
        webui=f"http://{HOST}:{webui}",
        work_dir=work_dir,
        log_dir=log_dir,
    )
    commands = [
        (
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", HOST, "--port", str(port), "--webui-port", str(webui)),
            ],
        )
    ]
    for index in range(workers):
        commands.append(
            (
                f"worker-{index}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.url,
                    *("--cores", "1", "--memory", memory, "--host", HOST),
                    *("--webui-port", str(free_port()), "--work-dir", str(work_dir)),
                ],
            )
        )
    try:
        for name, args in commands:
            with (log_dir / f"{name}.log").open("wb") as out:
                cluster.processes.append(
                    subprocess.Popen(
                        [str(spark_class()), *args],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,  # a process group to kill, executors included
                    )
                )
        _wait_for_workers(cluster, workers, timeout)
        yield cluster
    finally:
        cluster.stop()


def _wait_for_workers(cluster: StandaloneCluster, workers: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    alive = 0
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"a Spark standalone process exited ({process.returncode}): "
                    f"{process.args!r}\n{_log_tail(cluster.log_dir / 'master.log')}"
                )
        with contextlib.suppress(OSError, ValueError):
            alive = cluster.alive_workers()
            if alive >= workers:
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"{alive} of {workers} Spark workers registered within {timeout:.0f} s\n"
        f"{_log_tail(cluster.log_dir / 'master.log')}"
    )


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master with two one-core workers, shared by a module's tests."""
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster
