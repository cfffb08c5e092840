"""The change log on S3 (moto's server on loopback): one writer at a time through a lease
taken with conditional writes, and nothing confirmed before its segment's PUT returned."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.changelog.lease import LEASE_NAME
from pgcdc.errors import ChangeLogLocked, InvalidOption, StorageError
from pgcdc.localpg import free_port
from pgcdc.pipeline import load
from pgcdc.storage import StorageOptions
from tests.changelog.helpers import number_of, transactions

from .conftest import Bucket


def test_unknown_and_inconsistent_storage_options_are_refused_without_their_secrets() -> None:
    with pytest.raises(InvalidOption, match=r"'aws_endpont'.*did you mean 'aws_endpoint'"):
        StorageOptions.parse({"aws_endpont": "https://s3.example.com"})
    with pytest.raises(InvalidOption, match="aws_allow_http = true"):
        StorageOptions.parse({"endpoint": "http://127.0.0.1:9000"})
    with pytest.raises(InvalidOption, match="together") as refused:
        StorageOptions.parse({"AWS_SECRET_ACCESS_KEY": "CanarySecret"})
    assert "CanarySecret" not in str(refused.value)
    options = StorageOptions.parse(
        {"AWS_ACCESS_KEY_ID": "id", "secret_access_key": "CanarySecret", "token": "CanaryToken"}
    )
    assert options.values["aws_secret_access_key"] == "CanarySecret"
    assert "Canary" not in repr(options) and "Canary" not in str(options)


def test_flush_returns_only_what_a_new_reader_finds_on_the_store(bucket: Bucket) -> None:
    """What ``flush()`` returns (what the receiver confirms to the slot) is already readable by
    any other process: each flush completes the PUT of a whole segment before it returns."""
    uri = bucket.uri("log")
    with ChangeLog(uri, storage=bucket.storage()).writer() as writer:
        for batch in (range(1, 4), range(4, 9)):
            for txn in transactions(batch.start, batch.stop):
                writer.append(txn)
            confirmed = writer.flush()
            reader = ChangeLog(uri, storage=bucket.storage())
            found = [t.end_lsn for t in reader.read_transactions()]
            assert found and found[-1] == confirmed
            assert [number_of(t.commit_lsn) for t in reader.read_transactions()] == list(
                range(1, batch.stop)
            )
    assert not [key for key in bucket.objects() if key.endswith(".tmp")]
    # Reopened, the writer goes on after the last transaction.
    with ChangeLog(uri, storage=bucket.storage()).writer() as writer:
        assert number_of(writer.last_commit_lsn) == 8
        assert not writer.append(next(transactions(8, 9)))


def test_a_second_writer_is_refused_while_the_first_holds_the_lease(bucket: Bucket) -> None:
    uri = bucket.uri("log")
    log = ChangeLog(uri, storage=bucket.storage())
    with log.writer() as first:
        with pytest.raises(ChangeLogLocked, match="holds the change log"):
            log.writer()
        first.append(next(transactions(1, 2)))
        first.flush()
    # Released on close: the next writer starts at once.
    with log.writer() as second:
        assert number_of(second.last_commit_lsn) == 1
    assert LEASE_NAME not in {key.rsplit("/", 1)[-1] for key in bucket.objects()}


def test_an_expired_lease_is_taken_over_and_its_old_holder_writes_nothing(
    bucket: Bucket,
) -> None:
    """A writer whose lease ran out (it stopped renewing: a paused or partitioned process) is
    replaced, and its next flush is refused instead of writing beside the new writer."""
    uri = bucket.uri("log")
    log = ChangeLog(uri, storage=bucket.storage())
    stale = log.writer(lease_seconds=0.6)
    stale._lease._stop.set()  # type: ignore[union-attr]  # stands for a paused process
    stale.append(next(transactions(1, 2)))
    time.sleep(0.7)
    with log.writer() as successor:
        assert successor.last_commit_lsn == 0
        held = json.loads(bucket.objects()[f"log/{LEASE_NAME}"])
        assert held["expires_at"] > time.time()
        with pytest.raises(ChangeLogLocked, match="no longer holds"):
            stale.flush()
        successor.append(next(transactions(1, 2)))
        successor.flush()
    assert [number_of(t.commit_lsn) for t in log.read_transactions()] == [1]
    segments = [key for key in bucket.objects() if key.endswith(".pgcdcseg")]
    assert len(segments) == 1


def test_storage_options_in_the_pipeline_config_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        '[source]\nconninfo = "host=h"\n[paths]\nchangelog = "s3://b/log"\n'
        'storage_options = { aws_regoin = "x", aws_secret_access_key = "CanarySecret" }\n'
    )
    with pytest.raises(
        InvalidOption,
        match=r"storage_options: unknown key 'aws_regoin'.*"
        r"did you mean 'aws_region'",
    ) as refused:
        load(config, {})
    assert "CanarySecret" not in str(refused.value)
    config.write_text(
        '[source]\nconninfo = "host=h"\n[paths]\nchangelog = "s3://b/log"\n'
        '[paths.storage_options]\nAWS_REGION = "eu-west-1"\naws_access_key_id = "id"\n'
        'aws_secret_access_key = "CanarySecret"\n'
    )
    settings = load(config, {})
    assert settings.storage.values["aws_region"] == "eu-west-1"
    assert settings.pipeline().storage == settings.storage
    assert "CanarySecret" not in repr(settings)


def test_a_waiting_writer_takes_over_from_a_dead_holder_but_not_from_a_live_one(
    bucket: Bucket,
) -> None:
    """What a restarted pipeline does (``lease_wait``): it waits out the lease once; a holder
    that renewed it meanwhile is alive and is not replaced, one that did not is gone."""
    uri = bucket.uri("log")
    log = ChangeLog(uri, storage=bucket.storage())
    with log.writer(lease_seconds=0.9) as live:
        with pytest.raises(ChangeLogLocked, match="holds the change log"):
            log.writer(lease_wait=True)
        live.append(next(transactions(1, 2)))
    crashed = log.writer(lease_seconds=5)
    crashed._lease._stop.set()  # type: ignore[union-attr]  # as if SIGKILLed: no renewal, no release
    crashed._lease._thread.join()  # type: ignore[union-attr]
    crashed.append(next(transactions(2, 3)))
    with log.writer(lease_wait=True) as restarted:
        assert number_of(restarted.last_commit_lsn) == 1
    with pytest.raises(ChangeLogLocked, match="no longer holds"):
        crashed.flush()
    assert [number_of(t.commit_lsn) for t in log.read_transactions()] == [1]


def test_an_unreachable_store_is_a_storage_error_without_the_secret() -> None:
    options = StorageOptions.parse(
        {
            "aws_endpoint_url": f"http://127.0.0.1:{free_port()}",
            "aws_allow_http": "true",
            "aws_access_key_id": "id",
            "aws_secret_access_key": "CanarySecret",
        }
    )
    with pytest.raises(StorageError, match="cannot take the writer lease") as refused:
        ChangeLog("s3://nowhere/log", storage=options).writer()
    assert "CanarySecret" not in str(refused.value) and "\n" not in str(refused.value)
