"""One writer per change log on S3: a lease object taken with a conditional write.

A local log is locked with ``flock``; an object store has no locks, so the writer of an
``s3://`` log holds ``writer.lease``: a small JSON object (owner, host, pid, expiry) created
with ``If-None-Match: *``, which the store refuses when the object exists, and renewed in the
background with ``If-Match: <its ETag>``, which it refuses when another writer replaced it.
A lease past its expiry (its writer died) may be taken over, again with ``If-Match``, so two
writers racing for it cannot both win. The writer checks its lease before each segment it
puts, so a writer that lost its lease (renewals failing for longer than the lease) stops
instead of writing beside the new one.

Conditional writes come from ``obstore`` (Rust's ``object_store``, what delta-rs uses):
pyarrow's S3 filesystem and fsspec do not expose them, and boto3 is not a dependency. Expiry
is judged by the wall clocks of the hosts involved: keep them within a few seconds.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pgcdc.errors import ChangeLogLocked, ConfigurationError, StorageError
from pgcdc.storage import StorageOptions

log = logging.getLogger(__name__)

LEASE_NAME = "writer.lease"
DEFAULT_LEASE_SECONDS = 60.0


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class WriterLease:
    """The lease of one writer on the log at ``uri``; ``acquire()``, ``check()``, ``release()``."""

    def __init__(
        self, uri: str, storage: StorageOptions | None, *, seconds: float = DEFAULT_LEASE_SECONDS
    ) -> None:
        try:
            import obstore
            from obstore.store import from_url
        except ImportError:
            raise ConfigurationError(
                f"a change log on object storage ({uri}) needs the obstore package for its "
                "writer lease: pip install 'pgcdc[s3]'"
            ) from None
        config, client = (storage or StorageOptions()).object_store()
        self._obstore = obstore
        self._store = from_url(uri, config=config, client_options=client)  # type: ignore[call-overload]
        self._uri = uri
        self._seconds = seconds
        self._owner = uuid.uuid4().hex
        self._etag: str | None = None
        self._renewed = 0.0
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self, now: float) -> bytes:
        return json.dumps(
            {
                "owner": self._owner,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "expires_at": now + self._seconds,
            }
        ).encode()

    def _put(self, mode: Any) -> None:
        now = time.time()
        result = self._obstore.put(self._store, LEASE_NAME, self._body(now), mode=mode)
        self._etag = result["e_tag"]
        self._renewed = now

    def _held(self) -> tuple[str, float, str]:
        """The current lease's ETag, expiry and holder."""
        held = self._obstore.get(self._store, LEASE_NAME)
        etag = str(held.meta["e_tag"])  # S3 gives every object one
        try:
            holder = json.loads(bytes(held.bytes()))
            return (
                etag,
                float(holder["expires_at"]),
                f"{holder['host']} pid {holder['pid']}",
            )
        except (ValueError, KeyError, TypeError):
            return etag, 0.0, "an unreadable lease"

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """The store's other errors (unreachable, refused credentials) as a one-line
        StorageError; obstore's messages name the URL, never a credential."""
        errors = self._obstore.exceptions
        try:
            yield
        except (errors.AlreadyExistsError, errors.PreconditionError):
            raise
        except errors.BaseError as exc:
            reason = next(iter(str(exc).splitlines()), type(exc).__name__)
            raise StorageError(
                f"cannot take the writer lease of the change log at {self._uri}: {reason}; "
                "check [paths] storage_options (endpoint, region, credentials) or AWS_*"
            ) from None

    def acquire(self, *, wait: bool = False) -> None:
        """Take the lease, or raise ChangeLogLocked naming its live holder.

        ``wait``: when the lease is held, wait until its expiry once (at most one lease
        length); a holder that did not renew it meanwhile is gone (a restart after a crash),
        and the expired lease is taken over."""
        with self._reaching():
            self._take(wait)
        self._thread = threading.Thread(target=self._keep, name="pgcdc-lease", daemon=True)
        self._thread.start()

    def _take(self, wait: bool) -> None:
        errors = self._obstore.exceptions
        try:
            self._put("create")
        except errors.AlreadyExistsError:
            etag, expires, who = self._held()
            if wait and expires > time.time():
                log.warning(
                    "change log %s: waiting until %s for the writer lease of %s (renewed if "
                    "that writer still runs)",
                    self._uri,
                    _when(expires),
                    who,
                )
                time.sleep(min(expires - time.time(), self._seconds) + 0.1)
                etag, expires, who = self._held()  # renewed meanwhile: its writer runs
            if expires > time.time():
                raise ChangeLogLocked(
                    f"another writer ({who}) holds the change log at {self._uri} until "
                    f"{_when(expires)} (its lease, {LEASE_NAME}, is renewed while it runs): "
                    "stop it first (only one writer may append to a log); if it is gone, run "
                    "again once the lease has expired"
                ) from None
            try:
                self._put({"e_tag": etag})
            except (errors.PreconditionError, errors.AlreadyExistsError):
                raise ChangeLogLocked(
                    f"another writer took over the expired lease of the change log at "
                    f"{self._uri} just now: only one writer may append to a log"
                ) from None
            log.warning("change log %s: took over the expired lease of %s", self._uri, who)

    def _keep(self) -> None:
        """Renew every third of the lease; give up once another writer replaced it."""
        errors = self._obstore.exceptions
        while not self._stop.wait(self._seconds / 3):
            try:
                self._put({"e_tag": self._etag})
            except errors.PreconditionError:
                self._lost = "another writer replaced its lease"
                return
            except Exception as exc:  # a network fault: try again until the lease runs out
                log.warning("change log %s: renewing the writer lease failed: %s", self._uri, exc)

    def check(self) -> None:
        """Raise ChangeLogLocked unless this writer surely still holds the lease: renewed less
        than two thirds of it ago, so it cannot expire while the caller's PUT is under way."""
        if self._lost is None and time.time() - self._renewed > self._seconds * 2 / 3:
            self._lost = "its lease could not be renewed in time"
        if self._lost is not None:
            raise ChangeLogLocked(
                f"this writer no longer holds the change log at {self._uri} ({self._lost}); "
                "nothing more was written: another writer may be appending, stop one of them"
            )

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this writer's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._lost is not None or self._etag is None:
            return
        try:
            held = self._obstore.get(self._store, LEASE_NAME)
            if held.meta["e_tag"] == self._etag:
                self._obstore.delete(self._store, LEASE_NAME)
        except Exception as exc:  # it expires by itself
            log.warning("change log %s: releasing the writer lease failed: %s", self._uri, exc)
        self._etag = None
