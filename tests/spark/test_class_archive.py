"""``pgcdc.spark.class_archive``: the local driver JVM's class archive is made by a JVM of its own,
checked before it is put in place, and mapped by the next local session; an archive a JVM
cannot map never reaches the place sessions read it from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.spark import class_archive

# A local session in a process of its own (this process may already have a JVM): the options
# its driver JVM got, and the files that JVM mapped.
_SESSION = """
import json, sys
from pyspark import SparkContext
from pgcdc.spark.pipeline import spark_session
spark = spark_session("local[1]", "pgcdc-test-class-archive")
assert spark.range(10).count() == 10
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})
spark.stop()
print(json.dumps({"options": options, "mapped": mapped}))
"""


def _session(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _SESSION],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_built_archive_is_mapped_by_the_next_local_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PGCDC_CACHE_DIR", str(cache))
    monkeypatch.delenv("PGCDC_CLASS_ARCHIVE", raising=False)
    env = dict(os.environ)
    without = _session(env)
    assert not any(str(cache) in m for m in without["mapped"])  # type: ignore[attr-defined]

    # Archives of other javas or Sparks: the two newest may be other environments' and stay.
    cache.mkdir()
    others = [cache / f"spark-classes-{n:020d}.jsa" for n in range(3)]
    for age, other in enumerate(others):
        other.write_bytes(b"old")
        os.utime(other, (1e9 - age, 1e9 - age))
    archive = class_archive.build()
    assert archive is not None and archive == class_archive.archive_path()
    # No partial file; the oldest other archive removed.
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [archive.name, *(o.name for o in others[:2])]
    )
    assert class_archive.build() == archive  # made once

    with_archive = _session(env)
    assert str(archive) in with_archive["mapped"]  # type: ignore[operator]
    assert f"-XX:SharedArchiveFile={archive}" in str(with_archive["options"])

    off = _session({**env, "PGCDC_CLASS_ARCHIVE": "0"})
    assert str(archive) not in off["mapped"]  # type: ignore[operator]

    # What the check refuses: an archive cut short (the JVM writing it killed; mapped, it
    # crashes the JVM) and one that is not an archive (a JVM without the check would start
    # without it, quietly).
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert not class_archive._session_in_child("check", cut, timeout=300)
    garbage = tmp_path / "garbage.jsa"
    garbage.write_bytes(os.urandom(1 << 20))
    assert not class_archive._session_in_child("check", garbage, timeout=300)
    assert class_archive._session_in_child("check", archive, timeout=300)
    assert not list(Path.cwd().glob("hs_err_pid*.log"))  # no crash report left here
