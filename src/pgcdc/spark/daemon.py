"""``spark.python.daemon.module`` of pgcdc's sessions: pyspark's own daemon, with pyspark
imported from its installed package instead of ``$SPARK_HOME/python/lib/pyspark.zip``.

Spark puts pyspark.zip (and py4j's zip) first on every Python worker's path. Nothing imported
from a zip keeps compiled bytecode, so each new worker compiled pyspark from source (about
0.6 s of CPU on the shared 2-core machine, per process), and every task's
``importlib.invalidate_caches()`` re-read the zip's index. When the same pyspark version is
installed (a pip-installed pyspark: the common case), the zips leave the path here before
anything imports pyspark; otherwise nothing changes. Spark-core's jar, also on the path, goes
too when it holds no Python: each worker read the directory of its six thousand classes again
at every task's ``importlib.invalidate_caches()``. The daemon also imports pgcdc's read path
once for all the workers it forks.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import runpy
import sys
import zipfile
from importlib.machinery import PathFinder
from pathlib import Path

_VERSION = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""")


def _version(text: str) -> str | None:
    found = _VERSION.search(text)
    return found.group(1) if found else None


def _zip_version(path: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            return _version(archive.read("pyspark/version.py").decode())
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def installed_instead(path: list[str]) -> list[str]:
    """``path`` without Spark's pyspark/py4j zips when the pyspark found without them is the
    zip's version; ``path`` itself otherwise."""
    zips = [p for p in path if p.endswith(".zip") and Path(p).name.startswith(("pyspark", "py4j"))]
    spark_zip = next((p for p in zips if Path(p).name == "pyspark.zip"), None)
    if spark_zip is None:
        return path
    rest = [p for p in path if p not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    py4j = PathFinder.find_spec("py4j", rest)
    if spec is None or py4j is None or not spec.submodule_search_locations:
        return path
    installed = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        version = _version(installed.read_text())
    except OSError:
        return path
    if version is None or version != _zip_version(spark_zip):
        return path
    return rest


def _holds_python(archive: str) -> bool:
    """Whether a zip (or jar) on the path holds a Python module; unreadable ones count as if."""
    try:
        with zipfile.ZipFile(archive) as opened:
            return any(name.endswith((".py", ".pyc")) for name in opened.namelist())
    except (OSError, zipfile.BadZipFile):
        return True


def class_jars(path: list[str]) -> list[str]:
    """The jars on ``path`` that hold no Python (Spark puts spark-core's there, for deployments
    that ship pyspark inside it)."""
    return [p for p in path if p.endswith(".jar") and not _holds_python(p)]


def without_class_jars(path: list[str]) -> list[str]:
    """``path`` without its ``class_jars``; ``path`` itself when there are none."""
    jars = class_jars(path)
    return [p for p in path if p not in jars] if jars else path


def main() -> None:
    cleaned = without_class_jars(installed_instead(sys.path))
    if cleaned is not sys.path:
        for entry in set(sys.path) - set(cleaned):
            sys.path_importer_cache.pop(entry, None)
        sys.path[:] = cleaned
    # Workers are forked from the daemon and inherit its modules: import what pgcdc's read
    # tasks need (0.3 s of CPU) once here rather than in each worker.
    with contextlib.suppress(ImportError):
        importlib.import_module("pgcdc.spark.source")
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
