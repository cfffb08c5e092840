"""An S3-compatible server on loopback for the object storage tests: moto in server mode
(``moto[server]``, a dev dependency), one per session, a new bucket per test."""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pgcdc.storage import StorageOptions

_buckets = itertools.count()


@dataclass(frozen=True)
class Bucket:
    """A fresh bucket on the test server and the settings that reach it."""

    endpoint: str
    name: str
    access_key_id: str
    secret_access_key: str

    def uri(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def options(self) -> dict[str, str]:
        """As ``[paths] storage_options`` takes them."""
        return {
            "aws_endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_region": "us-east-1",
            "aws_allow_http": "true",
        }

    def storage(self) -> StorageOptions:
        return StorageOptions.parse(self.options())

    def client(self) -> Any:
        """boto3 (moto's dependency): only to look at what pgcdc left in the bucket."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name="us-east-1",
        )

    def objects(self) -> dict[str, bytes]:
        client = self.client()
        found = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.name):
            for item in page.get("Contents", []):
                body = client.get_object(Bucket=self.name, Key=item["Key"])["Body"].read()
                found[item["Key"]] = body
        return found


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, for the whole session."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.fail("moto's S3 server is missing: run scripts/setup (pip install 'moto[server]')")

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint: str) -> Bucket:
    """A new bucket; its secret key is a canary the tests look for in everything pgcdc wrote
    or printed (moto takes any credentials)."""
    made = Bucket(
        endpoint=s3_endpoint,
        name=f"pgcdc-test-{next(_buckets)}-{secrets.token_hex(3)}",
        access_key_id="testing",
        secret_access_key=f"Canary{secrets.token_hex(8)}",
    )
    made.client().create_bucket(Bucket=made.name)
    return made
