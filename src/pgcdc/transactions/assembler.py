"""Decoded events in stream order -> whole transactions in commit order.

A pure state machine: ``feed`` takes one event and returns the transactions it completed. The
only IO is spill files (``pgcdc.transactions.spill``) for transactions above the memory limits.

Rules, for every plugin (pgoutput v1-4, test_decoding, openGauss):

- Plain transactions: Begin ... Commit, emitted at Commit. pgoutput sends them whole at commit
  time, so arrival order is commit order.
- Streamed transactions (protocol 2+): changes arrive in StreamStart/StreamStop blocks that
  interleave with other transactions. They are buffered per top-level xid; a change whose
  ``xid`` differs from its block's xid belongs to a subtransaction of it. StreamCommit emits,
  StreamAbort drops the whole transaction (subxid == xid) or only the subtransaction's changes.
  Relation and Type events of an aborted subtransaction are kept: pgoutput remembers it sent a
  schema per top-level transaction and will not send it again within it.
- Two-phase (protocol 3, test_decoding two-phase-commit): a transaction ended by Prepare or
  StreamPrepare is held by gid until CommitPrepared (emitted) or RollbackPrepared (dropped).
  With ``emit_at_prepare`` it is emitted at PREPARE (outcome PREPARE, ``gid`` set) and the
  decision follows as a COMMIT_PREPARED or ROLLBACK_PREPARED record without events.
- Restarts: this state lives in memory only. After a reconnect the server resends every
  transaction that commits after the slot's confirmed position, so a fresh assembler sees each
  whole again. Prepared transactions are the exception: if the confirmed position passed a
  PREPARE, the server sends only COMMIT/ROLLBACK PREPARED later. A held prepared transaction
  is therefore part of ``oldest_pending_lsn``, and the receiver must never confirm beyond it;
  a COMMIT PREPARED for an unknown gid raises (its changes would be lost) unless it commits at
  or before ``stored_through`` (the consumer stored it before the restart, and the slot moved
  past its PREPARE afterwards) or ``emit_at_prepare`` is on, where the consumer already stored
  the prepared transaction.
- Origins: an Origin event inside a transaction is reported on it; ``origin_filter='none'``
  drops such transactions.
- Messages: transactional ones stay in their transaction; non-transactional ones are emitted at
  once as a transaction of their own (``xid`` None, ``commit_lsn`` at the message).
- Catalog events (Relation, Type) of a committed transaction that the filters drop (origin,
  skip-empty-xacts, or a rolled-back prepared one, whose schema the server also counts as sent)
  are carried into the next emitted transaction so consumers never miss a table definition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

from pgcdc.errors import TransactionSequenceError
from pgcdc.events import (
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Heartbeat,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    RowRun,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    builder,
)
from pgcdc.lsn import INVALID_LSN, LSN
from pgcdc.transactions.model import CommittedTransaction, TransactionOutcome
from pgcdc.transactions.options import AssemblyOptions
from pgcdc.transactions.sizing import estimate_size
from pgcdc.transactions.spill import SpillDirectory, SpillWriter, without_xid

_CONTENT_TYPES: Final = (Insert, Update, Delete, Truncate, Message)
_ROW_TYPES: Final = frozenset((Insert, Update, Delete))
_CATALOG_TYPES: Final = (Relation, Type)
_NOTHING: Final[tuple[CommittedTransaction, ...]] = ()
# Every emitted transaction is built with this (see pgcdc.events.builder): the frozen
# dataclass's own __init__ would cost more than the rest of a one-change transaction's emit.
_new_committed: Final = builder(CommittedTransaction)
_COMMIT_OUTCOME: Final = TransactionOutcome.COMMIT


def _committed(
    xid: int | None,
    commit_lsn: LSN,
    end_lsn: LSN,
    commit_time: datetime | None,
    events: Iterable[Event],
    *,
    origin: str | None,
    origin_lsn: LSN | None,
    gid: str | None,
    outcome: TransactionOutcome,
    size: int,
) -> CommittedTransaction:
    """``CommittedTransaction(...)`` without its ``__init__``."""
    return _new_committed(
        xid, commit_lsn, end_lsn, commit_time, events, origin, origin_lsn, gid, outcome, size
    )


def _is_catalog(event: Event) -> bool:
    return type(event) is Relation or type(event) is Type


def _without_subtransactions(aborted: frozenset[int]) -> Callable[[Event], bool]:
    """A filter for read-back that drops the content of aborted subtransactions."""

    def keep(event: Event) -> bool:
        return not (type(event) in _CONTENT_TYPES and getattr(event, "xid", None) in aborted)

    return keep


class _Txn:
    """One transaction being buffered: in memory, or (once too large) in a spill file."""

    __slots__ = (
        "aborted",
        "commit_time",
        "counts",
        "discarding",
        "events",
        "first_lsn",
        "memory",
        "origin",
        "origin_lsn",
        "size",
        "sizes",
        "spill",
        "subxids",
        "xid",
    )

    def __init__(self, xid: int | None, first_lsn: LSN, commit_time: datetime | None) -> None:
        self.xid = xid
        self.first_lsn = first_lsn
        self.commit_time = commit_time
        self.events: list[Event] = []
        self.sizes: list[int] = []
        self.memory = 0
        self.size = 0
        self.spill: SpillWriter | None = None
        self.origin: str | None = None
        self.origin_lsn: LSN | None = None
        # xid of the (sub)transaction -> [content events, their estimated bytes]
        self.counts: dict[int | None, list[int]] = {}
        self.aborted: set[int] = set()
        self.subxids: set[int] = set()
        # Origin-filtered: content is dropped as it arrives, catalog events are kept.
        self.discarding = False

    def content_count(self) -> int:
        return sum(entry[0] for entry in self.counts.values())


class TransactionAssembler:
    """Feed decoded events in stream order; get whole transactions back in commit order.

    Use as a context manager (or call ``close``) so spill files are removed on exit.
    """

    def __init__(
        self, options: AssemblyOptions | None = None, *, stored_through: LSN = INVALID_LSN
    ) -> None:
        """``stored_through`` is the commit LSN up to which the consumer already holds every
        transaction (its change log's last commit after a restart)."""
        self.options = options if options is not None else AssemblyOptions()
        self.stored_through = stored_through
        self._filter = self.options.table_filter
        self._txn_limit = self.options.max_txn_bytes
        self._total_limit = self.options.max_total_bytes
        self._spill_dir: SpillDirectory | None = None
        if self._txn_limit or self._total_limit:
            # Constructed now so files left by a crashed predecessor are removed at start.
            self._spill_dir = SpillDirectory(self.options.spill_dir)
        self._plain: _Txn | None = None
        self._plain_gid: str | None = None
        # Whether a plain commit's transaction is emitted as it was held (xids and times
        # kept, empty ones too): then ``feed`` emits it itself, see ``_commit_held``.
        self._emits_as_held = (
            self.options.include_xids
            and self.options.include_timestamp
            and not self.options.skip_empty_xacts
        )
        self._block: _Txn | None = None
        self._streams: dict[int, _Txn] = {}
        self._sub_to_top: dict[int, int] = {}
        self._prepared: dict[str, _Txn] = {}
        self._skipped_gids: set[str] = set()
        self._live: dict[_Txn, None] = {}
        self._memory = 0
        self._carry: list[Event] = []
        self._emitted_since_idle = False
        self._last_beat: datetime | None = None
        self.spilled_transactions = 0
        self._handlers: dict[type, Callable[[Any, int | None], Iterable[CommittedTransaction]]] = {
            Insert: self._on_row_change,
            Update: self._on_row_change,
            Delete: self._on_row_change,
            RowRun: self._on_row_run,
            Truncate: self._on_truncate,
            Relation: self._on_relation,
            Type: self._on_type,
            Message: self._on_message,
            Origin: self._on_origin,
            Begin: self._on_begin,
            Commit: self._on_commit,
            BeginPrepare: self._on_begin_prepare,
            Prepare: self._on_prepare,
            CommitPrepared: self._on_commit_prepared,
            RollbackPrepared: self._on_rollback_prepared,
            StreamStart: self._on_stream_start,
            StreamStop: self._on_stream_stop,
            StreamCommit: self._on_stream_commit,
            StreamAbort: self._on_stream_abort,
            StreamPrepare: self._on_stream_prepare,
            Heartbeat: self._on_heartbeat,
        }

    # --- public API -------------------------------------------------------------------------

    def feed(self, event: Event, size: int | None = None) -> list[CommittedTransaction]:
        """Take the next event; return the transactions it completed (usually none or one).

        ``size`` is the event's payload length when the caller knows it (for memory limits);
        otherwise it is estimated from the values' lengths.
        """
        if type(event) in _ROW_TYPES and self._block is None and self._filter is None:
            # The hot path: a row change of a plain (not streamed) transaction.
            txn = self._plain
            if txn is not None:
                if size is None or txn.spill is not None or txn.discarding:
                    self._add(txn, event, size, content=True)
                else:
                    self._hold(txn, event, event.xid, 1, size)  # type: ignore[union-attr]
                return []
        kind = type(event)
        if kind is Commit:
            committed = self.commit_held(
                event.lsn,
                event.commit_lsn,  # type: ignore[union-attr]
                event.end_lsn,  # type: ignore[union-attr]
                event.commit_time,  # type: ignore[union-attr]
                event.xid,  # type: ignore[union-attr]
            )
            if committed is not None:
                return [committed]
            return list(self._on_commit(event, size))  # type: ignore[arg-type]
        if kind is Begin:
            if not self.begin_plain(event.xid, event.lsn, event.commit_time):  # type: ignore[union-attr]
                self._on_begin(event, size)  # type: ignore[arg-type]
            return []
        handler = self._handlers.get(kind)
        if handler is None:
            raise TransactionSequenceError(
                f"{type(event).__name__} is not a pgcdc.events event; feed decoder output only"
            )
        return list(handler(event, size))

    def begin_plain(self, xid: int | None, lsn: LSN, commit_time: datetime | None) -> bool:
        """``feed`` of a Begin (at ``lsn``, of ``xid``, committed at ``commit_time``) outside
        any transaction or stream block, the hot path, taking the Begin's fields: True when
        done; False, with nothing done, when ``feed`` must take the Begin event instead."""
        if self._plain is not None or self._block is not None:
            return False
        # _on_begin, inlined.
        txn = _Txn(xid, lsn, commit_time)
        self._live[txn] = None
        self._plain = txn
        self._plain_gid = None
        return True

    def _on_row_run(self, run: RowRun, size: int | None) -> list[CommittedTransaction]:
        """A RowRun joins a plain transaction held in memory as one event; anywhere else (a
        filter, a spilled or origin-discarded transaction, no open transaction) its changes go
        in one by one."""
        txn = self._plain
        if (
            txn is None
            or size is None
            or self._block is not None
            or self._filter is not None
            or txn.spill is not None
            or txn.discarding
            or run.xid is not None
        ):
            sizes = [None] * len(run) if size is None else run.sizes(size)
            completed: list[CommittedTransaction] = []
            for change, change_size in zip(run.changes(), sizes, strict=True):
                completed.extend(self.feed(change, change_size))
            return completed
        self._hold(txn, run, None, len(run), size)
        return []

    def _hold(self, txn: _Txn, event: Event, xid: int | None, count: int, size: int) -> None:
        """Keep ``event`` (``count`` changes of ``xid``) in ``txn``, which is held in memory:
        ``_add`` without its checks, for the hot path."""
        entry = txn.counts.get(xid)
        if entry is None:
            txn.counts[xid] = [count, size]
        else:
            entry[0] += count
            entry[1] += size
        txn.size += size
        txn.events.append(event)
        txn.sizes.append(size)
        txn.memory += size
        self._memory += size
        if (self._txn_limit and txn.memory > self._txn_limit) or (
            self._total_limit and self._memory > self._total_limit
        ):
            self._enforce_limits(txn)

    def feed_all(self, events: Iterable[Event]) -> Iterator[CommittedTransaction]:
        for event in events:
            yield from self.feed(event)

    def idle(self, now: datetime, server_wal_end: LSN) -> Heartbeat | None:
        """Called while the stream is quiet: a Heartbeat when ``heartbeat_interval`` has passed
        since output last moved (the first call after output starts the clock).

        Its ``lsn`` is ``server_wal_end`` capped at ``oldest_pending_lsn``, so a consumer may
        confirm up to it without skipping anything still buffered here.
        """
        if not self.options.enable_heartbeat:
            return None
        if self._last_beat is None or self._emitted_since_idle:
            self._last_beat = now
            self._emitted_since_idle = False
            return None
        if (now - self._last_beat).total_seconds() < self.options.heartbeat_interval:
            return None
        self._last_beat = now
        lsn = server_wal_end
        oldest = self.oldest_pending_lsn
        if oldest is not None and oldest < lsn:
            lsn = oldest
        return Heartbeat(LSN(lsn), now if self.options.include_timestamp else None)

    @property
    def oldest_pending_lsn(self) -> LSN | None:
        """The first LSN of the oldest transaction still buffered (in progress, streamed or
        prepared and held); None when nothing is. Never confirm a flush position beyond it."""
        if not self._live:
            return None
        return min(txn.first_lsn for txn in self._live)

    @property
    def memory_bytes(self) -> int:
        """Estimated bytes of events held in memory (spilled transactions count zero)."""
        return self._memory

    @property
    def pending_transactions(self) -> int:
        return len(self._live)

    def close(self) -> None:
        """Drop everything buffered and remove this assembler's spill files."""
        for txn in list(self._live):
            self._drop(txn)
        self._plain = self._block = None
        self._streams.clear()
        self._prepared.clear()
        self._sub_to_top.clear()
        if self._spill_dir is not None:
            self._spill_dir.close()

    def __enter__(self) -> TransactionAssembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- events inside a transaction ----------------------------------------------------------

    def _receiving(self, event: Event) -> _Txn:
        """The transaction an in-transaction event belongs to."""
        block = self._block
        if block is not None:
            xid = getattr(event, "xid", None)
            if xid is not None and xid != block.xid and xid not in block.subxids:
                assert block.xid is not None
                block.subxids.add(xid)
                self._sub_to_top[xid] = block.xid
            return block
        if self._plain is not None:
            return self._plain
        raise TransactionSequenceError(
            f"{type(event).__name__} at {event.lsn} arrived outside any transaction (no Begin, "
            "BeginPrepare or StreamStart before it); decoding must start at a transaction "
            "boundary, from the slot's confirmed position"
        )

    def _on_row_change(
        self, event: Insert | Update | Delete, size: int | None
    ) -> Iterable[CommittedTransaction]:
        txn = self._receiving(event)
        if self._filter is None or self._filter.matches(event.table):
            self._add(txn, event, size, content=True)
        return ()

    def _on_truncate(self, event: Truncate, size: int | None) -> Iterable[CommittedTransaction]:
        txn = self._receiving(event)
        if self._filter is not None:
            kept = tuple(t for t in event.tables if self._filter.matches(t))
            if not kept:
                return ()
            if len(kept) != len(event.tables):
                event = replace(event, tables=kept)
        self._add(txn, event, size, content=True)
        return ()

    def _on_relation(self, event: Relation, size: int | None) -> Iterable[CommittedTransaction]:
        txn = self._receiving(event)
        if self._filter is None or self._filter.matches(event.table):
            self._add(txn, event, size, content=False)
        return ()

    def _on_type(self, event: Type, size: int | None) -> Iterable[CommittedTransaction]:
        self._add(self._receiving(event), event, size, content=False)
        return ()

    def _on_message(self, event: Message, size: int | None) -> Iterable[CommittedTransaction]:
        if event.transactional:
            self._add(self._receiving(event), event, size, content=True)
            return ()
        size = estimate_size(event) if size is None else size
        message = without_xid(event) if not self.options.include_xids else event
        self._emitted_since_idle = True
        return (CommittedTransaction(None, event.lsn, event.lsn, None, (message,), size=size),)

    def _on_origin(self, event: Origin, size: int | None) -> Iterable[CommittedTransaction]:
        txn = self._receiving(event)
        if txn.origin is None:
            txn.origin = event.name
            txn.origin_lsn = event.origin_lsn
        if self.options.origin_filter == "none" and not txn.discarding:
            self._start_discarding(txn)
        return ()

    def _on_heartbeat(self, event: Heartbeat, size: int | None) -> Iterable[CommittedTransaction]:
        """Server heartbeats (openGauss 'h') are the receiver's business, not a transaction."""
        return ()

    # --- plain and two-phase boundaries -------------------------------------------------------

    def _open_plain(self, event: Begin | BeginPrepare, commit_time: datetime | None) -> _Txn:
        if self._plain is not None or self._block is not None:
            inside = "a transaction" if self._plain is not None else "a stream block"
            raise TransactionSequenceError(
                f"{type(event).__name__} for xid {event.xid} at {event.lsn} arrived inside "
                f"{inside} that never ended; the stream lost events, restart decoding from the "
                "slot's confirmed position with a fresh assembler"
            )
        txn = _Txn(event.xid, event.lsn, commit_time)
        self._live[txn] = None
        self._plain = txn
        return txn

    def _on_begin(self, event: Begin, size: int | None) -> Iterable[CommittedTransaction]:
        self._open_plain(event, event.commit_time)
        self._plain_gid = None
        return ()

    def _on_begin_prepare(
        self, event: BeginPrepare, size: int | None
    ) -> Iterable[CommittedTransaction]:
        self._open_plain(event, event.prepare_time)
        self._plain_gid = event.gid
        return ()

    def _close_plain(self, event: Commit | Prepare) -> _Txn:
        txn = self._plain
        if txn is None:
            raise TransactionSequenceError(
                f"{type(event).__name__} at {event.lsn} without a Begin; decoding must start "
                "at a transaction boundary, from the slot's confirmed position"
            )
        if event.xid is not None and txn.xid is not None and event.xid != txn.xid:
            raise TransactionSequenceError(
                f"{type(event).__name__} for xid {event.xid} at {event.lsn} ends the "
                f"transaction begun as xid {txn.xid}; the stream lost events"
            )
        self._plain = None
        return txn

    def commit_held(
        self,
        lsn: LSN,
        commit_lsn: LSN | None,
        end_lsn: LSN | None,
        commit_time: datetime | None,
        xid: int | None,
    ) -> CommittedTransaction | None:
        """``feed`` of a Commit, the hot path of ``_on_commit``, taking the Commit's fields: a
        plain transaction held in memory, nothing to strip, carry or filter, emitted as
        ``_emit`` would; None, with nothing done, otherwise (``feed`` must take the Commit
        event then)."""
        txn = self._plain
        if (
            txn is None
            or not self._emits_as_held
            or self._plain_gid is not None
            or txn.spill is not None
            or txn.discarding
            or self._carry
            or (xid is not None and txn.xid is not None and xid != txn.xid)
        ):
            return None
        self._plain = None
        # _release, inlined: a plain transaction in memory has no spill file.
        self._live.pop(txn, None)
        self._memory -= txn.memory
        txn.memory = 0
        self._emitted_since_idle = True
        return _committed(
            txn.xid if txn.xid is not None else xid,
            commit_lsn if commit_lsn is not None else lsn,
            end_lsn if end_lsn is not None else lsn,
            commit_time or txn.commit_time,
            tuple(txn.events),
            origin=txn.origin,
            origin_lsn=txn.origin_lsn,
            gid=None,
            outcome=_COMMIT_OUTCOME,
            size=txn.size,
        )

    def _on_commit(self, event: Commit, size: int | None) -> Iterable[CommittedTransaction]:
        if self._plain_gid is not None:
            raise TransactionSequenceError(
                f"Commit at {event.lsn} ends a transaction begun with BeginPrepare "
                f"(gid {self._plain_gid!r}); expected Prepare"
            )
        txn = self._close_plain(event)
        return self._emit(
            txn,
            xid=txn.xid if txn.xid is not None else event.xid,
            commit_lsn=event.commit_lsn if event.commit_lsn is not None else event.lsn,
            end_lsn=event.end_lsn if event.end_lsn is not None else event.lsn,
            commit_time=event.commit_time or txn.commit_time,
        )

    def _on_prepare(self, event: Prepare, size: int | None) -> Iterable[CommittedTransaction]:
        if self._plain_gid is not None and self._plain_gid != event.gid:
            raise TransactionSequenceError(
                f"Prepare of gid {event.gid!r} at {event.lsn} ends the transaction begun "
                f"with BeginPrepare gid {self._plain_gid!r}; the stream lost events"
            )
        txn = self._close_plain(event)
        self._plain_gid = None
        if txn.xid is None:
            txn.xid = event.xid
        return self._prepared_done(txn, event)

    def _prepared_done(
        self, txn: _Txn, event: Prepare | StreamPrepare
    ) -> Iterable[CommittedTransaction]:
        gid = event.gid
        if gid in self._prepared:
            raise TransactionSequenceError(
                f"a second transaction was prepared as {gid!r} (xid {event.xid}, at "
                f"{event.lsn}) while the first is still held; gids are unique until settled"
            )
        if not self.options.emit_at_prepare:
            self._prepared[gid] = txn
            return ()
        emitted = self._emit(
            txn,
            xid=event.xid,
            commit_lsn=event.prepare_lsn,
            end_lsn=event.end_lsn,
            commit_time=event.prepare_time,
            gid=gid,
            outcome=TransactionOutcome.PREPARE,
        )
        if not emitted:
            self._skipped_gids.add(gid)  # filtered out: its decision is not news either
        return emitted

    def _on_commit_prepared(
        self, event: CommitPrepared, size: int | None
    ) -> Iterable[CommittedTransaction]:
        if self.options.emit_at_prepare:
            return self._settled(
                event, event.commit_lsn, event.end_lsn, event.commit_time, commit=True
            )
        txn = self._prepared.pop(event.gid, None)
        if txn is None:
            if event.commit_lsn <= self.stored_through:
                # Already stored before a restart. The slot was then confirmed past its
                # PREPARE (nothing was held any more), so the server resends only the decision.
                return ()
            raise TransactionSequenceError(
                f"COMMIT PREPARED {event.gid!r} (xid {event.xid}) at {event.lsn}, but its "
                "PREPARE was not seen: the slot's confirmed position passed the PREPARE before "
                "a restart, so the server will not resend its changes. Never confirm beyond "
                "TransactionAssembler.oldest_pending_lsn; to recover, re-read the transaction "
                "from a copy or re-snapshot the tables, or use emit_at_prepare with a consumer "
                "that stores prepared transactions"
            )
        return self._emit(
            txn,
            xid=event.xid,
            commit_lsn=event.commit_lsn,
            end_lsn=event.end_lsn,
            commit_time=event.commit_time,
        )

    def _on_rollback_prepared(
        self, event: RollbackPrepared, size: int | None
    ) -> Iterable[CommittedTransaction]:
        if self.options.emit_at_prepare:
            return self._settled(
                event, event.lsn, event.rollback_end_lsn, event.rollback_time, commit=False
            )
        txn = self._prepared.pop(event.gid, None)
        if txn is not None:
            # The server counted the prepared transaction's schema messages as sent.
            self._carry.extend(self._catalog_events(txn))
            self._drop(txn)
        return ()

    def _settled(
        self,
        event: CommitPrepared | RollbackPrepared,
        commit_lsn: LSN,
        end_lsn: LSN,
        when: datetime | None,
        *,
        commit: bool,
    ) -> Iterable[CommittedTransaction]:
        if event.gid in self._skipped_gids:
            self._skipped_gids.discard(event.gid)
            return ()
        self._emitted_since_idle = True
        outcome = (
            TransactionOutcome.COMMIT_PREPARED if commit else TransactionOutcome.ROLLBACK_PREPARED
        )
        return (
            CommittedTransaction(
                event.xid if self.options.include_xids else None,
                commit_lsn,
                end_lsn,
                when if self.options.include_timestamp else None,
                (),
                gid=event.gid,
                outcome=outcome,
            ),
        )

    # --- streamed transactions ----------------------------------------------------------------

    def _on_stream_start(
        self, event: StreamStart, size: int | None
    ) -> Iterable[CommittedTransaction]:
        if self._plain is not None or self._block is not None:
            raise TransactionSequenceError(
                f"StreamStart for xid {event.xid} at {event.lsn} inside an unfinished "
                "transaction or stream block; the stream lost events, restart decoding from "
                "the slot's confirmed position with a fresh assembler"
            )
        txn = self._streams.get(event.xid)
        if txn is None:
            if not event.first_segment:
                raise TransactionSequenceError(
                    f"StreamStart for xid {event.xid} at {event.lsn} continues a streamed "
                    "transaction whose first segment this assembler never saw; its earlier "
                    "changes are missing. Restart decoding from the slot's confirmed position "
                    "with a fresh assembler"
                )
            txn = _Txn(event.xid, event.lsn, None)
            self._streams[event.xid] = txn
            self._live[txn] = None
        self._block = txn
        return ()

    def _on_stream_stop(
        self, event: StreamStop, size: int | None
    ) -> Iterable[CommittedTransaction]:
        if self._block is None:
            raise TransactionSequenceError(
                f"StreamStop at {event.lsn} without a StreamStart; the stream lost events"
            )
        self._block = None
        return ()

    def _end_stream(self, event: StreamCommit | StreamPrepare) -> _Txn:
        if self._block is not None:
            raise TransactionSequenceError(
                f"{type(event).__name__} for xid {event.xid} at {event.lsn} inside a stream "
                "block; the StreamStop before it is missing"
            )
        txn = self._streams.pop(event.xid, None)
        if txn is None:
            raise TransactionSequenceError(
                f"{type(event).__name__} for xid {event.xid} at {event.lsn}, but no change of "
                "that streamed transaction was seen; restart decoding from the slot's confirmed "
                "position with a fresh assembler"
            )
        for subxid in txn.subxids:
            self._sub_to_top.pop(subxid, None)
        return txn

    def _on_stream_commit(
        self, event: StreamCommit, size: int | None
    ) -> Iterable[CommittedTransaction]:
        txn = self._end_stream(event)
        return self._emit(
            txn,
            xid=event.xid,
            commit_lsn=event.commit_lsn,
            end_lsn=event.end_lsn,
            commit_time=event.commit_time,
        )

    def _on_stream_prepare(
        self, event: StreamPrepare, size: int | None
    ) -> Iterable[CommittedTransaction]:
        return self._prepared_done(self._end_stream(event), event)

    def _on_stream_abort(
        self, event: StreamAbort, size: int | None
    ) -> Iterable[CommittedTransaction]:
        if self._block is not None:
            raise TransactionSequenceError(
                f"StreamAbort for xid {event.xid} at {event.lsn} inside a stream block; the "
                "StreamStop before it is missing"
            )
        top = event.xid if event.xid in self._streams else self._sub_to_top.get(event.xid)
        if top is None:
            return ()  # nothing of it was streamed to us, so nothing to drop
        txn = self._streams[top]
        if event.subxid == top:
            del self._streams[top]
            for subxid in txn.subxids:
                self._sub_to_top.pop(subxid, None)
            self._drop(txn)
        else:
            self._abort_subtransaction(txn, event.subxid)
        return ()

    def _abort_subtransaction(self, txn: _Txn, subxid: int) -> None:
        entry = txn.counts.pop(subxid, None)
        if entry is None:
            return
        txn.size -= entry[1]
        txn.aborted.add(subxid)
        if txn.spill is None:
            kept_events: list[Event] = []
            kept_sizes: list[int] = []
            freed = 0
            for event, size in zip(txn.events, txn.sizes, strict=True):
                if type(event) in _CONTENT_TYPES and getattr(event, "xid", None) == subxid:
                    freed += size
                else:
                    kept_events.append(event)
                    kept_sizes.append(size)
            txn.events, txn.sizes = kept_events, kept_sizes
            txn.memory -= freed
            self._memory -= freed

    # --- buffering and spilling ---------------------------------------------------------------

    def _add(self, txn: _Txn, event: Event, size: int | None, *, content: bool) -> None:
        if size is None:
            size = estimate_size(event)
        if content:
            if txn.discarding:
                return
            xid = getattr(event, "xid", None)
            entry = txn.counts.get(xid)
            if entry is None:
                txn.counts[xid] = [1, size]
            else:
                entry[0] += 1
                entry[1] += size
        txn.size += size
        if txn.spill is not None:
            txn.spill.append(event, size)
            return
        txn.events.append(event)
        txn.sizes.append(size)
        txn.memory += size
        self._memory += size
        self._enforce_limits(txn)

    def _enforce_limits(self, txn: _Txn) -> None:
        """Spill ``txn`` above the per-transaction limit, the largest ones above the total."""
        if self._txn_limit and txn.memory > self._txn_limit:
            self._spill(txn)
        if self._total_limit and self._memory > self._total_limit:
            self._evict()

    def _spill(self, txn: _Txn) -> None:
        assert self._spill_dir is not None and txn.spill is None
        writer = self._spill_dir.new_file()
        for event, size in zip(txn.events, txn.sizes, strict=True):
            if type(event) is RowRun:  # spill files hold plain events
                for change, change_size in zip(event.changes(), event.sizes(size), strict=True):
                    writer.append(change, change_size)
            else:
                writer.append(event, size)
        txn.spill = writer
        self._memory -= txn.memory
        txn.memory = 0
        txn.events = []
        txn.sizes = []
        self.spilled_transactions += 1

    def _evict(self) -> None:
        """Spill the largest in-memory transactions until the total fits again."""
        while self._memory > self._total_limit:
            victim = max(self._live, key=lambda t: t.memory)
            if victim.memory == 0:
                break
            self._spill(victim)

    def _start_discarding(self, txn: _Txn) -> None:
        catalog = self._catalog_events(txn)
        self._release(txn)
        txn.events = catalog
        txn.sizes = [estimate_size(e) for e in catalog]
        txn.memory = sum(txn.sizes)
        txn.size = txn.memory
        self._memory += txn.memory
        txn.counts.clear()
        txn.discarding = True
        self._live[txn] = None

    def _catalog_events(self, txn: _Txn) -> list[Event]:
        if txn.spill is None:
            return [e for e in txn.events if _is_catalog(e)]
        with txn.spill.finish(keep=_is_catalog) as spilled:
            catalog = list(spilled)
        txn.spill = None
        return catalog

    def _release(self, txn: _Txn) -> None:
        """Forget a transaction's memory and spill file (its events were read or dropped)."""
        self._live.pop(txn, None)
        self._memory -= txn.memory
        txn.memory = 0
        if txn.spill is not None:
            txn.spill.discard()
            txn.spill = None

    def _drop(self, txn: _Txn) -> None:
        self._release(txn)
        txn.events = []
        txn.sizes = []

    def _emit(
        self,
        txn: _Txn,
        *,
        xid: int | None,
        commit_lsn: LSN,
        end_lsn: LSN,
        commit_time: datetime | None,
        gid: str | None = None,
        outcome: TransactionOutcome = TransactionOutcome.COMMIT,
    ) -> tuple[CommittedTransaction, ...]:
        options = self.options
        if txn.discarding or (options.skip_empty_xacts and txn.content_count() == 0):
            self._carry.extend(self._catalog_events(txn))
            self._drop(txn)
            return _NOTHING
        strip = not options.include_xids
        events: Iterable[Event]
        if self._carry:
            prefix = [without_xid(e) for e in self._carry] if strip else self._carry
            self._carry = []
        else:
            prefix = []
        if txn.spill is not None:
            keep = _without_subtransactions(frozenset(txn.aborted)) if txn.aborted else None
            events = txn.spill.finish(keep=keep, strip_xids=strip, prefix=tuple(prefix))
            txn.spill = None
        elif strip:
            events = tuple(prefix) + tuple(without_xid(e) for e in txn.events)
        elif prefix:
            events = tuple(prefix) + tuple(txn.events)
        else:
            events = tuple(txn.events)
        size = txn.size
        self._drop(txn)
        self._emitted_since_idle = True
        committed = _committed(
            xid if options.include_xids else None,
            commit_lsn,
            end_lsn,
            commit_time if options.include_timestamp else None,
            events,
            origin=txn.origin,
            origin_lsn=txn.origin_lsn,
            gid=gid,
            outcome=outcome,
            size=size,
        )
        return (committed,)
