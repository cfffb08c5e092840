"""The interpreter a local Spark session starts for its Python processes: this one, behind a
small shell script that takes Spark's pyspark/py4j zips off ``PYTHONPATH``.

``spark.python.daemon.module`` (``pgcdc.spark.daemon``) only reaches the workers that run tasks.
A streaming query also starts processes of its own, each once per query: the data source
lookup, its creation, read planning and the streaming source runner. Each compiled pyspark from
the zip (0.7-0.9 s of CPU apiece, measured), CPU a local pipeline's receiver needs. Spark
builds their ``PYTHONPATH`` itself, zips first, so the only place left to change it is the
executable named by ``PYSPARK_PYTHON``. The zips are dropped only when the installed pyspark
is the zip's version (``installed_instead``), and only on POSIX, where a script can stand in
for an interpreter.
"""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from pgcdc.spark import source_runner
from pgcdc.spark.daemon import installed_instead


def spark_home() -> Path:
    """SPARK_HOME, found the way pyspark's launcher finds it."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def spark_zips() -> list[str]:
    """The zips Spark puts first on its Python processes' path (``$SPARK_HOME/python/lib``)."""
    return sorted(str(p) for p in (spark_home() / "python" / "lib").glob("*.zip"))


def wrapper_script(python: str, zips: list[str]) -> str:
    """A POSIX shell script that runs ``python`` with every entry in ``zips`` removed from
    ``PYTHONPATH`` (the other entries keep their order), and pgcdc's streaming source runner
    in place of pyspark's (``pgcdc.spark.source_runner``: the same runner, without a traceback
    when Spark stops it)."""
    patterns = "|".join(shlex.quote(z) for z in zips)
    runner = shlex.quote(source_runner.PYSPARK_MODULE)
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
        f'exec {shlex.quote(python)} "$@"\n'
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
    script.write_text(wrapper_script(sys.executable, zips))
    script.chmod(0o700)
    return str(script)


_chosen: list[str] = []  # the PYSPARK_PYTHON values this process set (never the user's)


def choose_python(local: bool) -> None:
    """Set ``PYSPARK_PYTHON`` for the next session: the wrapper for a local one, this
    interpreter for a cluster, whose workers may not have the wrapper's temporary file. A value
    the user set is kept; one this process set for an earlier session is replaced, so a local
    session's wrapper never reaches a later cluster session's executors."""
    current = os.environ.get("PYSPARK_PYTHON")
    if current is not None and current not in _chosen:
        return
    wanted = worker_python() if local else sys.executable
    os.environ["PYSPARK_PYTHON"] = wanted
    _chosen.append(wanted)
