"""``pgcdc.spark.daemon``: Python workers drop Spark's pyspark/py4j zips from their path only
when the installed pyspark is the zip's version (so they never run another pyspark than the
JVM's), and then import pyspark from the installed package."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pyspark

from pgcdc.spark.daemon import installed_instead
from pgcdc.spark.pipeline import spark_session

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


def test_workers_of_a_pgcdc_session_import_the_installed_pyspark() -> None:
    spark = spark_session("local[1]", "pgcdc-daemon-test")
    try:

        def where(_: int) -> str:
            import pyspark as worker_pyspark

            return str(worker_pyspark.__file__)

        files = set(spark.sparkContext.parallelize([0, 1], 2).map(where).collect())
    finally:
        spark.stop()
    assert files == {pyspark.__file__}
