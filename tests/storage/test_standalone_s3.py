"""The pipeline on a Spark standalone cluster (tests/spark/cluster.py) with the change log and
the lake on S3 (moto's server on loopback): executors in the worker JVMs read the change log
from the bucket with ``[paths] storage_options``, the driver writes the lake there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Database
from tests.spark.cluster import StandaloneCluster, spark_cluster
from tests.spark.test_standalone import check_pipeline_on_cluster

from .conftest import Bucket

__all__ = ["spark_cluster"]  # the fixture, imported to be used here


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_pipeline_on_a_standalone_cluster_with_s3(
    db: Database, bucket: Bucket, tmp_path: Path, spark_cluster: StandaloneCluster
) -> None:
    paths = (bucket.uri("changelog"), bucket.uri("lake"))
    check_pipeline_on_cluster(db, spark_cluster, tmp_path, paths, bucket.options())
    assert any(
        key.startswith("changelog/") and key.endswith(".pgcdcseg") for key in bucket.objects()
    )
    # The secret key reached the executors as a source option: it is in no Spark event log and
    # no executor or worker log.
    canary = bucket.secret_access_key.encode()
    for folder in (tmp_path / "events", spark_cluster.work_dir, spark_cluster.log_dir):
        for path in folder.rglob("*"):
            assert not path.is_file() or canary not in path.read_bytes(), path
