"""Replication connections and the logical replication stream, blocking and asyncio.

Connections are opened with psycopg's public API (conninfo strings and URIs, PG* variables,
.pgpass, TLS and SCRAM all come from libpq), then spoken to at the ``psycopg.pq`` level with the
simple query protocol, which is all a walsender accepts. Every protocol step is a generator
(``_Session`` and ``_StreamCore``) driven by ``pgcdc.connection.waiting``: one implementation,
two thin front ends (``ReplicationConnection`` and ``AsyncReplicationConnection``).

The stream only ever reports to the server the position the consumer confirmed with
``confirm``: the server's slot may then discard WAL up to there, so reporting anything later
could lose changes the consumer has not stored yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, NoReturn, TypeVar

import psycopg
from psycopg import pq

from pgcdc import errors
from pgcdc.connection import commands
from pgcdc.connection.commands import (
    Command,
    CreatedSlot,
    ErrorMapper,
    Options,
    ResultSet,
    SlotPosition,
    SnapshotAction,
    SystemIdentity,
    TimelineHistory,
)
from pgcdc.connection.conninfo import timed_out
from pgcdc.connection.copyread import (
    CONSUME_FAILED,
    COPY_ENDED,
    COPY_FAILED,
    NativeRead,
    native_reader,
)
from pgcdc.connection.protocol import (
    DEFAULT_MAX_MESSAGE_SIZE,
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    parse_xlog_data,
    standby_status_update,
)
from pgcdc.connection.server_errors import translate
from pgcdc.connection.waiting import (
    READ,
    WRITE,
    PQGen,
    SyncWaiter,
    held_to,
    readable_now,
    run_async,
)
from pgcdc.lsn import INVALID_LSN, LSN

T = TypeVar("T")

DEFAULT_STATUS_INTERVAL: Final = 10.0  # seconds, as pg_recvlogical
# Messages one read_many() call hands out at most: the consumer's own clocks (flush, stop) are
# looked at between batches. Small batches keep few objects alive at once, so the garbage
# collector's young generation rarely fills (1024 costs ~20% more CPU than 64 in profiles).
DEFAULT_BATCH: Final = 64
# read_many's coalescing (``coalesce`` of start_replication): after a batch that was not full
# and left the socket empty (the stream has caught up with the server), the next call first
# waits that many seconds, so the server's next messages come in one batch and one wakeup rather
# than a wakeup (the client's, and on the server the walsender's send that wakes it) per
# message. A short batch alone does not say the stream caught up: in a backlog of wide rows one
# read of libpq's buffer holds fewer messages than a batch while the socket holds more. The
# default, 0, reads eagerly, as pg_recvlogical does; the receiver chooses its own
# (pgcdc.receiver).
DEFAULT_COALESCE: Final = 0.0
_XLOG_DATA: Final = ord("w")

_COMMAND_OK: Final = pq.ExecStatus.COMMAND_OK
_TUPLES_OK: Final = pq.ExecStatus.TUPLES_OK
_COPY_BOTH: Final = pq.ExecStatus.COPY_BOTH
_COPY_STATES: Final = (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH)
_ERROR_STATES: Final = (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR)
_SQLSTATE: Final = pq.DiagnosticField.SQLSTATE
_MESSAGE: Final = pq.DiagnosticField.MESSAGE_PRIMARY
_DETAIL: Final = pq.DiagnosticField.MESSAGE_DETAIL

_CONNECT_ARGS: Final[dict[str, Any]] = {"replication": "database", "autocommit": True}


def _connect_error(error: psycopg.OperationalError) -> errors.PgcdcError:
    """A typed error for a failed connection attempt (libpq gives text, rarely a SQLSTATE)."""
    message = " ".join(str(error).split())  # libpq's text spans lines; the CLI prints one
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return errors.AuthenticationFailed(
            f"{message}; check the user's password (conninfo, PGPASSWORD or ~/.pgpass) and the "
            "authentication method pg_hba.conf requires for this host"
        )
    if "replication" in lowered and (
        "permission denied" in lowered or "must be superuser or replication" in lowered
    ):
        return translate("42501", message)
    return errors.ConnectionFailed(
        f"{message}; check host, port, TLS settings (sslmode, sslrootcert) and that the server "
        "accepts replication connections for this user and database in pg_hba.conf"
    )


def _result_error(result: pq.abc.PGresult, encoding: str) -> tuple[str | None, str, str | None]:
    def field(code: pq.DiagnosticField) -> str | None:
        value = result.error_field(code)
        return None if value is None else value.decode(encoding, "replace")

    message = field(_MESSAGE) or (result.error_message.decode(encoding, "replace").strip())
    return field(_SQLSTATE), message, field(_DETAIL)


def _result_set(result: pq.abc.PGresult, encoding: str) -> ResultSet:
    columns = tuple(
        (result.fname(i) or b"").decode(encoding, "replace") for i in range(result.nfields)
    )
    rows = tuple(
        tuple(result.get_value(r, c) for c in range(result.nfields)) for r in range(result.ntuples)
    )
    return ResultSet(columns, rows, encoding)


class _Session:
    """The protocol steps of a replication connection, as generators over one PGconn."""

    def __init__(self, pgconn: pq.abc.PGconn, encoding: str) -> None:
        self.pgconn = pgconn
        self.encoding = encoding
        self.stream: _StreamCore | None = None
        self.completed_streams = 0

    def lost(self, error: Exception | None = None) -> errors.ConnectionLost:
        detail = f": {error}" if error else ""
        return errors.ConnectionLost(
            f"the connection to the server was lost{detail}; reconnect and restart streaming "
            "from the last confirmed LSN (nothing after it was reported to the server)"
        )

    def consume(self) -> None:
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError as error:
            raise self.lost(error) from None

    def flush(self) -> bool:
        """Send what libpq has buffered; True when all of it went out."""
        try:
            return self.pgconn.flush() == 0
        except psycopg.OperationalError as error:
            raise self.lost(error) from None

    def send_gen(self, text: str) -> PQGen[None]:
        if self.stream is not None and not self.stream.ended:
            raise errors.InvalidArgument(
                "a replication stream is running on this connection; stop() it before sending "
                "another command"
            )
        try:
            self.pgconn.send_query(text.encode(self.encoding))
        except UnicodeEncodeError as error:
            raise errors.InvalidArgument(
                f"{text!r} cannot be sent in the connection's encoding {self.encoding}: {error}"
            ) from None
        except psycopg.OperationalError as error:
            raise self.lost(error) from None
        while not self.flush():
            ready = yield READ | WRITE, None
            if ready & READ:
                self.consume()

    def pending_results(self) -> list[pq.abc.PGresult]:
        """The results libpq can hand out without waiting. After the server closed the socket,
        they hold the error it sent first: a FATAL is followed by no ReadyForQuery, so libpq
        holds it back until it sees the connection end. libpq's own error for the closed
        socket (it has no SQLSTATE) is left out: it is no word from the server."""
        results: list[pq.abc.PGresult] = []
        with contextlib.suppress(psycopg.OperationalError):
            self.pgconn.consume_input()  # the rest of the error, and the end of the socket
        with contextlib.suppress(psycopg.OperationalError):
            while not self.pgconn.is_busy() and (result := self.pgconn.get_result()):
                if result.status in _ERROR_STATES and result.error_field(_SQLSTATE) is None:
                    continue
                results.append(result)
                if result.status in _COPY_STATES:  # still streaming: no error to be had
                    break
        return results

    def fetch_gen(self) -> PQGen[pq.abc.PGresult | None]:
        while self.pgconn.is_busy():
            if (yield READ, None):
                self.consume()
        return self.pgconn.get_result()

    def results_gen(self) -> PQGen[list[pq.abc.PGresult]]:
        """All results of the query in flight; stops early at a COPY (which has no end)."""
        results: list[pq.abc.PGresult] = []
        while True:
            try:
                result = yield from self.fetch_gen()
            except errors.ConnectionLost:
                results += self.pending_results()
                if any(r.status in _ERROR_STATES for r in results):
                    break  # the server said why before it closed: report that
                raise
            if result is None:
                return results
            results.append(result)
            if result.status in _COPY_STATES:
                return results
        return results

    def raise_for(
        self, results: list[pq.abc.PGresult], translate_error: ErrorMapper | None = None
    ) -> None:
        for result in results:
            if result.status in _ERROR_STATES:
                raise (translate_error or translate)(*_result_error(result, self.encoding))

    def execute_gen(
        self, text: str, translate_error: ErrorMapper | None = None
    ) -> PQGen[ResultSet]:
        """Run one command (or SQL statement); its last result's rows."""
        yield from self.send_gen(text)
        results = yield from self.results_gen()
        self.raise_for(results, translate_error)
        if not results:
            raise self.lost()
        last = results[-1]
        if last.status in _COPY_STATES:
            raise errors.ProtocolError(
                f"{text!r} started a COPY; use start_replication() for streaming"
            )
        if last.status not in (_COMMAND_OK, _TUPLES_OK):
            raise errors.ProtocolError(f"unexpected result status {last.status!r} for {text!r}")
        return _result_set(last, self.encoding)

    def start_gen(
        self,
        text: str,
        status_interval: float,
        max_message_size: int,
        receive_timeout: float | None = None,
    ) -> PQGen[_StreamCore]:
        if not status_interval > 0:
            raise errors.InvalidArgument(f"status_interval must be positive: {status_interval}")
        yield from self.send_gen(text)
        result = yield from self.fetch_gen()
        if result is None:
            raise errors.ProtocolError("the server sent no result for START_REPLICATION")
        if result.status != _COPY_BOTH:
            rest = yield from self.results_gen()  # leave the connection idle and usable
            self.raise_for([result, *rest])
            raise errors.ProtocolError(
                f"START_REPLICATION returned status {result.status!r} instead of COPY-BOTH"
            )
        if receive_timeout is not None and not receive_timeout >= 0:
            raise errors.InvalidArgument(
                f"receive_timeout must be None or 0 (no timeout) or positive: {receive_timeout}"
            )
        self.stream = _StreamCore(
            self, status_interval, max_message_size, receive_timeout=receive_timeout
        )
        return self.stream


class _StreamCore:
    """The COPY-BOTH state machine: messages in, status updates out, no blocking calls.

    ``poll`` takes what libpq already holds without waiting (the hot path); ``read_gen``
    waits for more, sending a status update whenever one falls due while it waits.

    A connection can die without an error (a network partition, a NAT or firewall dropping
    its state): the socket stays open and the server is merely silent. As PostgreSQL's
    ``wal_receiver_timeout``, after ``receive_timeout`` / 2 seconds without a message the
    core asks the server for a reply (a walsender answers with a keepalive even when idle),
    and after ``receive_timeout`` seconds it gives the connection up as lost.
    """

    def __init__(
        self,
        session: _Session,
        status_interval: float,
        max_message_size: int,
        clock: Callable[[], float] = time.monotonic,
        receive_timeout: float | None = None,
    ) -> None:
        self.session = session
        self.pgconn = session.pgconn
        self.status_interval = status_interval
        self.max_message_size = max_message_size
        self.clock = clock
        self.confirmed: LSN = INVALID_LSN
        self.server_wal_end: LSN | None = None
        self.last_keepalive: PrimaryKeepalive | None = None
        self.next_status = clock() + status_interval
        self.receive_timeout = receive_timeout or None  # None (or 0): wait for ever
        self.last_received = clock()
        self.ping_sent = False
        self.want_write = False
        self.copy_ended = False  # the server left COPY mode (error or shutdown)
        self.failed: errors.PgcdcError | None = None  # raised by poll_many after its batch
        self.ended = False  # the stream is over; the connection is idle or gone
        # poll_many's reader in C when this build has one (copyread.py), else None.
        self.native_read = native_reader()

    # --- outgoing ----------------------------------------------------------------------------

    def send_status(self, reply_requested: bool = False) -> None:
        """Queue a standby status update with the confirmed position and try to send it."""
        confirmed = self.confirmed
        message = standby_status_update(confirmed, confirmed, confirmed, None, reply_requested)
        try:
            queued = self.pgconn.put_copy_data(message)
            if queued == 0:  # libpq's buffer is full: retry when the socket takes more
                self.next_status = 0.0
                self.want_write = True
                return
            self.want_write = self.pgconn.flush() != 0
        except psycopg.OperationalError as error:
            self._raise_lost(error)
        self.next_status = self.clock() + self.status_interval

    def _flush(self) -> bool:
        """Send what libpq has buffered; True when all of it went out."""
        try:
            return self.pgconn.flush() == 0
        except psycopg.OperationalError as error:
            self._raise_lost(error)

    def _consume(self) -> None:
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError as error:
            self._raise_lost(error)

    def _raise_lost(self, error: psycopg.OperationalError) -> NoReturn:
        """Raise why the connection failed under a read or a write: the server's own error
        when it said why before it closed the connection (a terminated walsender's FATAL, an
        error about the slot), which libpq may hold; else ConnectionLost."""
        with contextlib.suppress(psycopg.OperationalError):
            # Messages before the error were not confirmed: the server sends them again.
            while self.pgconn.get_copy_data(1)[0] > 0:
                pass
        said = self._server_error(self.session.pending_results())
        if said is None:
            raise self.session.lost(error) from None
        self.copy_ended = self.ended = True
        raise said from said.__cause__

    def confirm(self, lsn: LSN) -> None:
        """The consumer has durably stored everything up to ``lsn``; tell the server now."""
        if self.ended:
            raise errors.InvalidArgument("the replication stream has ended; nothing to confirm")
        if lsn > self.confirmed:
            self.confirmed = LSN(lsn)
            self.send_status()

    # --- incoming ----------------------------------------------------------------------------

    def poll(self) -> XLogData | PrimaryKeepalive | None:
        """The next message libpq has already received, or None (nothing yet, or ended)."""
        if self.failed is not None:
            self._raise_failed()
        if self.copy_ended:
            return None
        if self.clock() >= self.next_status:
            self.send_status()
        try:
            size, data = self.pgconn.get_copy_data(1)
        except psycopg.OperationalError as error:
            self._raise_lost(error)
        if size > 0:
            self.last_received = self.clock()
            self.ping_sent = False
            message = parse_copy_data(data, self.max_message_size)
            if type(message) is PrimaryKeepalive:
                self._keepalive(message)
            return message
        if size == -1:
            self.copy_ended = True
        return None

    def poll_many(self, limit: int) -> list[XLogData | PrimaryKeepalive]:
        """Every message libpq has already received, up to ``limit``, without waiting.

        The hot path of a busy stream: one status-update check per batch rather than per
        message, and XLogData parsed without ``parse_copy_data``'s dispatch. Keepalives are
        answered as they are taken.
        An error after some messages were taken is raised by the next call, so the messages
        before it reach the consumer first.
        """
        messages: list[XLogData | PrimaryKeepalive] = []
        if self.failed is not None:
            self._raise_failed()
        if self.copy_ended:
            return messages
        if self.clock() >= self.next_status:
            self.send_status()
        native_read = self.native_read
        if native_read is not None:
            # None once closed (psycopg's PGconn has it, its typing does not): the Python path
            # then raises.
            conn = getattr(self.pgconn, "pgconn_ptr", None)
            if conn is not None:
                return self._poll_native(native_read, conn, limit)
        get_copy_data = self.pgconn.get_copy_data
        append = messages.append
        max_size = self.max_message_size
        read_socket = True
        taken = 0
        try:
            while taken < limit:
                size, data = get_copy_data(1)
                if size <= 0:
                    if size == -1:
                        self.copy_ended = True
                    elif read_socket:
                        # Take in what the kernel already holds (libpq's socket never blocks),
                        # sparing a wait on the socket when the stream is busy.
                        read_socket = False
                        self.pgconn.consume_input()
                        continue
                    break
                taken += 1
                if data[0] == _XLOG_DATA and size <= max_size:
                    append(parse_xlog_data(data))  # without parse_copy_data's dispatch
                    continue
                message = parse_copy_data(data, max_size)
                if type(message) is PrimaryKeepalive:
                    self._keepalive(message)
                append(message)
        except psycopg.OperationalError as error:
            self._lost_after(error, bool(messages))
        except errors.PgcdcError as error:
            self._failed_after(error, bool(messages))
        if taken:
            self.last_received = self.clock()
            self.ping_sent = False
        return messages

    def _poll_native(
        self, native_read: NativeRead, conn: int, limit: int
    ) -> list[XLogData | PrimaryKeepalive]:
        """``poll_many``'s Python path done by ``_copyread`` (see copyread.py): the same
        messages, in order, with the same errors. The C code hands any message but a
        well-formed XLogData over as its bytes, which are parsed (or refused) here."""
        messages, status, raw = native_read(conn, limit, self.max_message_size)
        failure = None
        if raw:
            messages, failure = self._parse_raw(messages)
        if failure is not None:
            # The messages after the one refused are dropped: the stream has failed.
            self._failed_after(failure, bool(messages))
        elif status == COPY_ENDED:
            self.copy_ended = True
        elif status in (COPY_FAILED, CONSUME_FAILED):
            what = "receiving copy data" if status == COPY_FAILED else "consuming input"
            error = psycopg.OperationalError(f"{what} failed: {self.pgconn.get_error_message()}")
            self._lost_after(error, bool(messages))
        if messages:
            self.last_received = self.clock()
            self.ping_sent = False
        return messages

    def _parse_raw(
        self, taken: list[Any]
    ) -> tuple[list[XLogData | PrimaryKeepalive], errors.PgcdcError | None]:
        """``taken`` with each bytes item parsed as poll_many's Python path parses it,
        keepalives answered in order; a message that fails to parse ends the batch there (the
        messages before it, and the error)."""
        max_size = self.max_message_size
        messages: list[XLogData | PrimaryKeepalive] = []
        for item in taken:
            if type(item) is bytes:
                try:
                    message = parse_copy_data(item, max_size)
                    if type(message) is PrimaryKeepalive:
                        self._keepalive(message)
                except errors.PgcdcError as error:
                    return messages, error
                messages.append(message)
            else:
                messages.append(item)
        return messages, None

    def _lost_after(self, error: psycopg.OperationalError, taken: bool) -> None:
        """Raise why the connection failed under a read (see ``_failed_after``)."""
        try:
            self._raise_lost(error)
        except errors.PgcdcError as failure:
            self._failed_after(failure, taken)

    def _failed_after(self, failure: errors.PgcdcError, taken: bool) -> None:
        """Raise ``failure``, or, once messages were ``taken``, keep it for the next call, so
        the messages before it reach the consumer first."""
        if not taken:
            raise failure
        self.failed = failure

    def _keepalive(self, message: PrimaryKeepalive) -> None:
        self.server_wal_end = message.wal_end
        self.last_keepalive = message
        if message.reply_requested:
            self.send_status()

    def _check_silence(self, now: float) -> float:
        """Ping a server silent for half of ``receive_timeout``, give up on one silent for all
        of it; the seconds until the next of these falls due."""
        timeout = self.receive_timeout
        assert timeout is not None
        silent = now - self.last_received
        if silent >= timeout:
            self.ended = True
            raise errors.ConnectionLost(
                f"no message from the server for {silent:.0f} s (receive_timeout="
                f"{timeout:g} s): the connection is presumed dead (a network partition?); "
                "reconnect and restart streaming from the last confirmed LSN"
            )
        if silent < timeout / 2:
            return timeout / 2 - silent
        if not self.ping_sent:
            self.ping_sent = True
            self.send_status(reply_requested=True)
        return timeout - silent

    def _raise_failed(self) -> None:
        error, self.failed = self.failed, None
        assert error is not None
        raise error

    def read_gen(self, timeout: float | None) -> PQGen[XLogData | PrimaryKeepalive | None]:
        if self.ended:
            raise errors.InvalidArgument(
                "the replication stream has ended (stopped, or the server ended it); start a "
                "new one on a new connection"
            )
        deadline = None if timeout is None else self.clock() + timeout
        waited = False  # look at the socket at least once, even with timeout=0
        # Whether the socket was read since this call began: a consumer busy for longer than
        # receive_timeout leaves the server's messages in the kernel, which is not silence.
        looked = False
        while True:
            message = self.poll()
            if message is not None:
                return message
            if self.copy_ended:
                yield from self.server_ended_gen()
            now = self.clock()
            if deadline is not None and now >= deadline and waited:
                return None
            waited = True
            wait = self.next_status - now
            if self.receive_timeout is not None:
                if not looked and now - self.last_received >= self.receive_timeout / 2:
                    looked = True
                    self._consume()
                    continue
                wait = min(wait, self._check_silence(now))
            if deadline is not None and deadline - now < wait:
                wait = deadline - now
            ready = yield (READ | WRITE if self.want_write else READ), max(wait, 0.0)
            looked = True
            if ready & WRITE:
                self.want_write = not self._flush()
            if ready & READ:
                self._consume()

    def server_ended_gen(self) -> PQGen[None]:
        """The server left COPY mode on its own: raise why (it always is an error to us)."""
        self.ended = True
        said = self._server_error((yield from self.session.results_gen()))
        if said is not None:
            raise said
        if self.session.completed_streams:
            raise errors.UnsupportedFeature(
                "the server ended this logical stream at once: a walsender keeps the end state "
                "of the previous stream on its connection, so every START_REPLICATION needs a "
                "new connection (ReplicationConnection.connect); this one still runs commands"
            )
        raise errors.ConnectionLost(
            "the server ended the replication stream without an error (shutting down?); "
            "reconnect and restart from the last confirmed LSN"
        )

    def _server_error(self, results: list[pq.abc.PGresult]) -> errors.ReplicationStreamError | None:
        """The server's error among ``results`` (its cause the specific error ``translate``
        makes of it, e.g. SlotInvalidated), None when it sent none."""
        for result in results:
            if result.status in _ERROR_STATES:
                sqlstate, message, detail = _result_error(result, self.session.encoding)
                specific = translate(sqlstate, message, detail)
                error = errors.ReplicationStreamError(message, sqlstate=sqlstate, detail=detail)
                if type(specific) is not errors.ServerError:
                    error.__cause__ = specific
                return error
        return None

    def stop_gen(self) -> PQGen[None]:
        """Report the confirmed position, send CopyDone, drain to CommandComplete; held to
        ``receive_timeout`` as reading is, so a stop on a silent network ends too (the
        receiver stops its stream on the way out of every failed session)."""
        if self.ended:
            return
        timeout = self.receive_timeout
        deadline = None if timeout is None else self.clock() + timeout

        def unanswered() -> errors.ConnectionLost:
            self.copy_ended = self.ended = True
            return errors.ConnectionLost(
                f"stopping the stream got no answer from the server within {timeout:g} s "
                "(receive_timeout): the connection is presumed dead (a network partition?); "
                "reconnect and restart streaming from the last confirmed LSN"
            )

        yield from held_to(self._stop_gen(), deadline, self.clock, unanswered)

    def _stop_gen(self) -> PQGen[None]:
        if self.copy_ended:
            yield from self.server_ended_gen()
        self.send_status()
        try:
            while self.pgconn.put_copy_end(None) == 0:
                yield WRITE, None
        except psycopg.OperationalError as error:
            self._raise_lost(error)
        while not self._flush():
            if (yield READ | WRITE, None) & READ:
                self._consume()
        # Messages still in flight were not confirmed; the server sends them again next time.
        while True:
            try:
                size, _ = self.pgconn.get_copy_data(1)
            except psycopg.OperationalError as error:
                self._raise_lost(error)
            if size == -1:
                break
            if size == 0 and (yield READ, None):
                self._consume()
        self.copy_ended = self.ended = True
        self.session.completed_streams += 1
        self.session.raise_for((yield from self.session.results_gen()))


class _ConnectionBase:
    def __init__(self, connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]):
        self.connection = connection
        self._session = _Session(connection.pgconn, connection.info.encoding)

    @property
    def pgconn(self) -> pq.abc.PGconn:
        return self._session.pgconn

    @property
    def server_version(self) -> int:
        """As libpq reports it: 150004 for 15.4."""
        return self.pgconn.server_version

    def _start_command(self, slot_name: str, start_lsn: LSN, options: Options) -> str:
        return commands.start_replication(slot_name, start_lsn, options)


def _checked_batch(core: _StreamCore, limit: int) -> _StreamCore:
    if not isinstance(limit, int) or limit < 1:
        raise errors.InvalidArgument(f"limit must be a positive number of messages, not {limit!r}")
    return core


def _checked_coalesce(coalesce: float) -> float:
    """``coalesce`` as seconds, checked before START_REPLICATION is sent."""
    if not isinstance(coalesce, int | float) or not 0 <= coalesce <= 1:
        raise errors.InvalidArgument(f"coalesce must be between 0 and 1 second, not {coalesce!r}")
    return float(coalesce)


class _StreamBase:
    def __init__(self, core: _StreamCore, fileno: int, coalesce: float) -> None:
        self._core = core
        self._fileno = fileno
        self._coalesce = coalesce
        self._next_read = 0.0  # monotonic time before which read_many waits (see DEFAULT_COALESCE)

    def _pause(self, timeout: float | None) -> float:
        """How long read_many waits before it reads: what is left of the pause after a partial
        batch, at most ``timeout``."""
        if not self._next_read:
            return 0.0
        left = self._next_read - self._core.clock()
        self._next_read = 0.0
        if left <= 0:
            return 0.0
        return left if timeout is None else max(min(left, timeout), 0.0)

    def _taken(
        self, messages: list[XLogData | PrimaryKeepalive], limit: int
    ) -> list[XLogData | PrimaryKeepalive]:
        if self._coalesce and 0 < len(messages) < limit and not readable_now(self._fileno):
            self._next_read = self._core.clock() + self._coalesce
        return messages

    @property
    def confirmed_lsn(self) -> LSN:
        """The position last reported to the server as written, flushed and applied."""
        return self._core.confirmed

    @property
    def server_wal_end(self) -> LSN | None:
        """wal_end of the latest keepalive: all WAL before it has been sent to us."""
        return self._core.server_wal_end

    @property
    def last_keepalive(self) -> PrimaryKeepalive | None:
        return self._core.last_keepalive

    @property
    def ended(self) -> bool:
        return self._core.ended

    def confirm(self, lsn: LSN) -> None:
        """Everything up to ``lsn`` is stored; the slot may advance to it. Never blocks."""
        self._core.confirm(lsn)


class ReplicationStream(_StreamBase):
    """A running START_REPLICATION: iterate for XLogData, or read() to see keepalives too."""

    def __init__(self, core: _StreamCore, waiter: SyncWaiter, coalesce: float) -> None:
        super().__init__(core, waiter.fileno, coalesce)
        self._waiter = waiter

    def read(self, timeout: float | None = None) -> XLogData | PrimaryKeepalive | None:
        """The next message, or None after ``timeout`` seconds without one."""
        message = self._core.poll()
        if message is not None:
            return message
        return self._waiter.run(self._core.read_gen(timeout))

    def read_many(
        self, timeout: float | None = None, limit: int = DEFAULT_BATCH
    ) -> list[XLogData | PrimaryKeepalive]:
        """Every message already received (up to ``limit``), else the next one to arrive with
        those that came with it; [] after ``timeout`` seconds without any. The fast way to
        consume a busy stream: one call per batch instead of one per message. After a batch
        that was not full, the next call first waits the stream's ``coalesce`` seconds (at most
        ``timeout``) for more to arrive."""
        core = _checked_batch(self._core, limit)
        pause = self._pause(timeout)
        if pause:
            time.sleep(pause)
            timeout = None if timeout is None else timeout - pause
        messages = core.poll_many(limit)
        if messages:
            return self._taken(messages, limit)
        message = self._waiter.run(core.read_gen(timeout))
        if message is None:
            return messages
        messages.append(message)
        if limit > 1:
            messages += core.poll_many(limit - 1)
        return self._taken(messages, limit)

    def __iter__(self) -> Iterator[XLogData]:
        return self

    def __next__(self) -> XLogData:
        core, run = self._core, self._waiter.run
        while True:
            message = core.poll() or run(core.read_gen(None))
            if type(message) is XLogData:
                return message

    def stop(self) -> None:
        """End the stream cleanly; the connection can run commands again afterwards."""
        self._waiter.run(self._core.stop_gen())

    def __enter__(self) -> ReplicationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._core.ended and self._core.session.pgconn.status == pq.ConnStatus.OK:
            self.stop()


class AsyncReplicationStream(_StreamBase):
    """The asyncio twin of ReplicationStream (same generators, driven by the event loop)."""

    def __init__(self, core: _StreamCore, fileno: int, coalesce: float) -> None:
        super().__init__(core, fileno, coalesce)

    async def read(self, timeout: float | None = None) -> XLogData | PrimaryKeepalive | None:
        message = self._core.poll()
        if message is not None:
            return message
        return await run_async(self._core.read_gen(timeout), self._fileno)

    async def read_many(
        self, timeout: float | None = None, limit: int = DEFAULT_BATCH
    ) -> list[XLogData | PrimaryKeepalive]:
        """As ``ReplicationStream.read_many``."""
        core = _checked_batch(self._core, limit)
        pause = self._pause(timeout)
        if pause:
            await asyncio.sleep(pause)
            timeout = None if timeout is None else timeout - pause
        messages = core.poll_many(limit)
        if messages:
            return self._taken(messages, limit)
        message = await run_async(core.read_gen(timeout), self._fileno)
        if message is None:
            return messages
        messages.append(message)
        if limit > 1:
            messages += core.poll_many(limit - 1)
        return self._taken(messages, limit)

    def __aiter__(self) -> AsyncIterator[XLogData]:
        return self

    async def __anext__(self) -> XLogData:
        core = self._core
        while True:
            message = core.poll() or await run_async(core.read_gen(None), self._fileno)
            if type(message) is XLogData:
                return message

    async def stop(self) -> None:
        await run_async(self._core.stop_gen(), self._fileno)

    async def __aenter__(self) -> AsyncReplicationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._core.ended and self._core.session.pgconn.status == pq.ConnStatus.OK:
            await self.stop()


class ReplicationConnection(_ConnectionBase):
    """A blocking replication connection (replication=database) to one database."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        super().__init__(connection)
        self._sync_connection = connection
        self._waiter = SyncWaiter(connection.pgconn.socket)

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> ReplicationConnection:
        """Connect as libpq would (conninfo or URI, PG* variables, .pgpass, TLS, SCRAM)."""
        try:
            connection = psycopg.Connection.connect(conninfo, **{**kwargs, **_CONNECT_ARGS})
        except psycopg.errors.ConnectionTimeout:
            raise timed_out(conninfo) from None
        except psycopg.OperationalError as error:
            raise _connect_error(error) from None
        return cls(connection)

    def run(self, command: Command[T]) -> T:
        gen = self._session.execute_gen(command.text, command.translate_error)
        return command.parse(self._waiter.run(gen))

    def execute(self, sql: str) -> ResultSet:
        """Plain SQL (simple query protocol), e.g. BEGIN before CREATE ... SNAPSHOT 'use'."""
        return self._waiter.run(self._session.execute_gen(sql))

    def identify_system(self) -> SystemIdentity:
        return self.run(commands.identify_system())

    def show(self, name: str) -> str:
        return self.run(commands.show(name))

    def timeline_history(self, timeline: int) -> TimelineHistory:
        return self.run(commands.timeline_history(timeline))

    def create_replication_slot(
        self,
        slot_name: str,
        output_plugin: str,
        *,
        temporary: bool = False,
        snapshot: SnapshotAction | None = None,
        two_phase: bool = False,
        failover: bool = False,
    ) -> CreatedSlot:
        return self.run(
            commands.create_replication_slot(
                self.server_version,
                slot_name,
                output_plugin,
                temporary=temporary,
                snapshot=snapshot,
                two_phase=two_phase,
                failover=failover,
            )
        )

    def read_replication_slot(self, slot_name: str) -> SlotPosition:
        return self.run(commands.read_replication_slot(self.server_version, slot_name))

    def alter_replication_slot(
        self, slot_name: str, *, two_phase: bool | None = None, failover: bool | None = None
    ) -> None:
        self.run(
            commands.alter_replication_slot(
                self.server_version, slot_name, two_phase=two_phase, failover=failover
            )
        )

    def drop_replication_slot(self, slot_name: str, *, wait: bool = False) -> None:
        self.run(commands.drop_replication_slot(slot_name, wait=wait))

    def start_replication(
        self,
        slot_name: str,
        start_lsn: LSN = INVALID_LSN,
        options: Options = (),
        *,
        status_interval: float = DEFAULT_STATUS_INTERVAL,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        receive_timeout: float | None = None,
        coalesce: float = DEFAULT_COALESCE,
    ) -> ReplicationStream:
        """Stream from a logical slot; 0/0 starts at the slot's confirmed_flush_lsn.
        ``receive_timeout``: seconds of silence after which the connection counts as lost;
        ``coalesce``: seconds ``read_many`` waits after a batch that was not full (see
        ``DEFAULT_COALESCE``; 0: read eagerly)."""
        coalesce = _checked_coalesce(coalesce)
        text = self._start_command(slot_name, start_lsn, options)
        core = self._waiter.run(
            self._session.start_gen(text, status_interval, max_message_size, receive_timeout)
        )
        return ReplicationStream(core, self._waiter, coalesce)

    def close(self) -> None:
        self._waiter.close()
        self._sync_connection.close()

    @property
    def closed(self) -> bool:
        return self._sync_connection.closed

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncReplicationConnection(_ConnectionBase):
    """The asyncio twin of ReplicationConnection."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        super().__init__(connection)
        self._async_connection = connection
        self._fileno = connection.pgconn.socket

    @classmethod
    async def connect(cls, conninfo: str = "", **kwargs: Any) -> AsyncReplicationConnection:
        try:
            connection = await psycopg.AsyncConnection.connect(
                conninfo, **{**kwargs, **_CONNECT_ARGS}
            )
        except psycopg.errors.ConnectionTimeout:
            raise timed_out(conninfo) from None
        except psycopg.OperationalError as error:
            raise _connect_error(error) from None
        return cls(connection)

    async def run(self, command: Command[T]) -> T:
        gen = self._session.execute_gen(command.text, command.translate_error)
        return command.parse(await run_async(gen, self._fileno))

    async def execute(self, sql: str) -> ResultSet:
        return await run_async(self._session.execute_gen(sql), self._fileno)

    async def identify_system(self) -> SystemIdentity:
        return await self.run(commands.identify_system())

    async def show(self, name: str) -> str:
        return await self.run(commands.show(name))

    async def timeline_history(self, timeline: int) -> TimelineHistory:
        return await self.run(commands.timeline_history(timeline))

    async def create_replication_slot(
        self,
        slot_name: str,
        output_plugin: str,
        *,
        temporary: bool = False,
        snapshot: SnapshotAction | None = None,
        two_phase: bool = False,
        failover: bool = False,
    ) -> CreatedSlot:
        return await self.run(
            commands.create_replication_slot(
                self.server_version,
                slot_name,
                output_plugin,
                temporary=temporary,
                snapshot=snapshot,
                two_phase=two_phase,
                failover=failover,
            )
        )

    async def read_replication_slot(self, slot_name: str) -> SlotPosition:
        return await self.run(commands.read_replication_slot(self.server_version, slot_name))

    async def alter_replication_slot(
        self, slot_name: str, *, two_phase: bool | None = None, failover: bool | None = None
    ) -> None:
        await self.run(
            commands.alter_replication_slot(
                self.server_version, slot_name, two_phase=two_phase, failover=failover
            )
        )

    async def drop_replication_slot(self, slot_name: str, *, wait: bool = False) -> None:
        await self.run(commands.drop_replication_slot(slot_name, wait=wait))

    async def start_replication(
        self,
        slot_name: str,
        start_lsn: LSN = INVALID_LSN,
        options: Options = (),
        *,
        status_interval: float = DEFAULT_STATUS_INTERVAL,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        receive_timeout: float | None = None,
        coalesce: float = DEFAULT_COALESCE,
    ) -> AsyncReplicationStream:
        coalesce = _checked_coalesce(coalesce)
        text = self._start_command(slot_name, start_lsn, options)
        core = await run_async(
            self._session.start_gen(text, status_interval, max_message_size, receive_timeout),
            self._fileno,
        )
        return AsyncReplicationStream(core, self._fileno, coalesce)

    async def close(self) -> None:
        await self._async_connection.close()

    @property
    def closed(self) -> bool:
        return self._async_connection.closed

    async def __aenter__(self) -> AsyncReplicationConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
