"""The oracle's second cluster: a native logical-replication subscriber of the same version as
the publisher (``cluster``, PG15 and PG18)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgcdc.localpg import LocalCluster
from tests.conftest import TEST_SETTINGS


@pytest.fixture(scope="session")
def subscriber_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    local = LocalCluster(cluster.installation, settings=TEST_SETTINGS)
    local.start()
    yield local
    local.destroy()
