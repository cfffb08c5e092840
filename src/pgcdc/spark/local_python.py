"""The interpreter a local Spark session starts for its Python processes: this one, behind a
small shell script that takes Spark's pyspark/py4j zips (and spark-core's jar, when it holds
no Python) off ``PYTHONPATH``.

``spark.python.daemon.module`` (``pgcdc.spark.daemon``) only reaches the workers that run tasks.
A streaming query also starts processes of its own, each once per query: the data source
lookup, its creation, read planning and the streaming source runner. Each compiled pyspark from
the zip, CPU a local pipeline's receiver needs. Spark builds their ``PYTHONPATH`` itself, zips
first, so the only place left to change it is the executable named by ``PYSPARK_PYTHON``. The
zips are dropped only when the installed pyspark is the zip's version (``installed_instead``),
and only on POSIX, where a script can stand in for an interpreter. The jar, a zip of some six
thousand classes, went on the path for deployments that ship pyspark inside it; Python read its
directory in every process and again at every task's ``importlib.invalidate_caches()``. The
script then asks the driver's fork server (``pgcdc.spark.fork_server``) for the process, so
that none of them starts an interpreter and imports pyspark at all.
"""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pgcdc.spark import fork_client, fork_server, source_runner
from pgcdc.spark.daemon import class_jars, installed_instead


def spark_home() -> Path:
    """SPARK_HOME, found the way pyspark's launcher finds it."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


_FORK_SOCKET = "fork.sock"  # beside the wrapper script
_SOCKET_PATH_MAX = 108  # sun_path, its final NUL included
FORK_SERVER_SWITCH = "PGCDC_FORK_SERVER"  # "0": every Python process starts an interpreter


def spark_zips() -> list[str]:
    """The zips Spark puts first on its Python processes' path (``$SPARK_HOME/python/lib``)."""
    return sorted(str(p) for p in (spark_home() / "python" / "lib").glob("*.zip"))


@functools.cache
def off_the_path() -> list[str]:
    """What the wrapper takes off ``PYTHONPATH``: Spark's zips, and spark-core's jars that
    hold no Python module."""
    return [*spark_zips(), *class_jars(_spark_core_jars())]


def wrapper_script(python: str, dropped: list[str], fork_socket: str | None = None) -> str:
    """A POSIX shell script that runs ``python`` with every entry in ``dropped`` removed from
    ``PYTHONPATH`` (the other entries keep their order), and pgcdc's streaming source runner
    in place of pyspark's (``pgcdc.spark.source_runner``: the same runner, without a traceback
    when Spark stops it). While a fork server listens on ``fork_socket``, the process is asked
    of it (``pgcdc.spark.fork_client``)."""
    patterns = "|".join(shlex.quote(entry) for entry in dropped)
    runner = shlex.quote(source_runner.PYSPARK_MODULE)
    python = shlex.quote(python)
    forked = ""
    if fork_socket is not None:
        client, sock = shlex.quote(fork_client.__file__), shlex.quote(fork_socket)
        forked = f'if [ -S {sock} ]; then\n  exec {python} -I -S {client} {sock} {python} "$@"\n'
        forked += "fi\n"
    return (
        "#!/bin/sh\n"
        "# Written by pgcdc.spark.local_python: Spark's Python processes import the installed\n"
        "# pyspark (same version) rather than compile it from Spark's zip at every start.\n"
        "set -f\n"
        "kept=\n"
        "IFS=:\n"
        "for entry in ${PYTHONPATH-}; do\n"
        f"  case $entry in {patterns}) ;; *) kept=${{kept:+$kept:}}$entry ;; esac\n"
        "done\n"
        "unset IFS\n"
        'PYTHONPATH="$kept"\n'
        "export PYTHONPATH\n"
        f'if [ "$#" -eq 2 ] && [ "$1" = -m ] && [ "$2" = {runner} ]; then\n'
        f"  set -- -m {source_runner.__name__}\n"
        "fi\n"
        f"{forked}"
        f'exec {python} "$@"\n'
    )


@functools.cache
def worker_python() -> str:
    """What ``PYSPARK_PYTHON`` should name for a local session: the wrapper script when the
    zips can go, ``sys.executable`` otherwise. Written once per process, removed at exit."""
    zips = spark_zips()
    if os.name != "posix" or not zips:
        return sys.executable
    with_zips = [*zips, *sys.path]
    if installed_instead(with_zips) is with_zips:
        return sys.executable
    folder = tempfile.mkdtemp(prefix="pgcdc-spark-python-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    script = Path(folder) / "python"
    socket = str(Path(folder) / _FORK_SOCKET)
    script.write_text(wrapper_script(sys.executable, off_the_path(), socket))
    script.chmod(0o700)
    return str(script)


_chosen: list[str] = []  # the values this process set (never the user's)
# Spark's Python processes for tasks and planning, and the data source lookup at session start.
PYTHON_VARIABLES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def choose_python(local: bool) -> None:
    """Set ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` for the next session: the wrapper
    for a local one, this interpreter for a cluster, whose workers may not have the wrapper's
    temporary file. A value the user set is kept; one this process set for an earlier session
    is replaced, so a local session's wrapper never reaches a later cluster session's
    executors."""
    wanted = worker_python() if local else sys.executable
    for name in PYTHON_VARIABLES:
        current = os.environ.get(name)
        if current is not None and current not in _chosen:
            continue
        os.environ[name] = wanted
        _chosen.append(wanted)


_fork_servers: list[fork_server.ForkServer] = []


def start_fork_server(settings: Mapping[str, str]) -> None:
    """Start the fork server the wrapper script asks for its processes
    (``pgcdc.spark.fork_server``), once per driver process, when the next session's Python
    processes run the wrapper, unless ``PGCDC_FORK_SERVER=0``. Call it as Spark's JVM starts:
    its processes inherit the JVM's environment, the driver's now, to which Spark adds what
    ``worker_environment`` adds."""
    if os.environ.get(FORK_SERVER_SWITCH) == "0":
        return
    wrapper = worker_python()
    if _fork_servers or wrapper == sys.executable or os.environ.get("PYSPARK_PYTHON") != wrapper:
        return
    path = str(Path(wrapper).parent / _FORK_SOCKET)
    if len(os.fsencode(path)) >= _SOCKET_PATH_MAX:
        return  # a long TMPDIR: the processes start their own interpreters
    server = fork_server.start(path, worker_environment(settings))
    _fork_servers.append(server)
    atexit.register(server.stop)


def worker_environment(settings: Mapping[str, str]) -> dict[str, str]:
    """The environment a local session with ``settings`` gives its Python processes, as the
    wrapper script passes it on (Spark's zips off ``PYTHONPATH``), up to the variables it sets
    per process (``fork_server.RUNTIME_PREFIXES``)."""
    env = dict(os.environ)
    # Spark's PYTHONPATH: its zips, the jar of spark-core (for deployments that ship pyspark in
    # it), then the JVM's own PYTHONPATH; the wrapper takes off what off_the_path() names.
    spark_path = [*spark_zips(), *_spark_core_jars(), *env.get("PYTHONPATH", "").split(os.pathsep)]
    dropped = set(off_the_path())
    env["PYTHONPATH"] = os.pathsep.join(e for e in spark_path if e and e not in dropped)
    env["PYTHONHASHSEED"] = env.get("PYTHONHASHSEED", "0")  # pyspark's SparkContext sets it so
    env["PYTHONUNBUFFERED"] = "YES"  # as Spark's PythonWorkerFactory sets it
    env.setdefault("OMP_NUM_THREADS", "1")  # as Spark sets it for a task's worker
    prefix = "spark.executorEnv."
    env.update({k[len(prefix) :]: v for k, v in settings.items() if k.startswith(prefix)})
    return env


def _spark_core_jars() -> list[str]:
    return sorted(str(p) for p in (spark_home() / "jars").glob("spark-core_*.jar"))
