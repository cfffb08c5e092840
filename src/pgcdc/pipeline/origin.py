"""Which replication slot a change log is filled from, so that a gap is never accepted silently.

A change log is complete only while one slot feeds it without a break: the server re-sends
everything after the slot's confirmed position, and pgcdc never confirms past what the log
holds (or, when idle, past what the stream has shown). A slot dropped and created again (the
remedy for an invalidated slot), or advanced by another client, starts after changes the log
never received; streaming it on would leave a gap the mirror can never fill.

PostgreSQL gives a slot no identity beyond its name, so the log keeps its own record, a small
JSON file beside the segments: the slot's name and database, where pgcdc first met it (its
consistent point when pgcdc created it), and ``confirmed_bound``, a position no confirmation
pgcdc ever sent to it passes. It is written before each confirmation goes out. A new slot's
confirmed position is its consistent point, the server's WAL position when it was created,
which lies past every confirmation sent to the old slot; so a slot whose confirmed position is
past ``confirmed_bound`` is not the one the log was filled from, even when WAL back to the
log's end happens to still be there.

Failover: a physical standby's copy of a failover slot (``sync_replication_slots``) is the same
slot for the log: it has the same name and database, the standby has the primary's system
identifier, and its confirmed position never passes what the primary's slot confirmed. The
record also keeps the system identifier and the timeline (IDENTIFY_SYSTEM). After a promotion
the server is on a new timeline; its history (TIMELINE_HISTORY) says where the recorded
timeline ended. A log that holds changes past that point holds changes the promoted standby
never received, which the source lost: that is refused (``TimelineDiverged``), as is a new
primary without the slot (``SlotNotSynced``), instead of a new slot with a gap.

Decoding on a standby: the slot is that standby's own (``on_standby`` in the record). When the
standby is promoted, the walsender goes on decoding the server's new timeline in the same
session, so the log may hold changes past where the old timeline ended; they came from that
same slot on that same server, which is accepted when the slot is not a synchronized copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pyarrow.fs as pafs

from pgcdc.changelog import ChangeLog
from pgcdc.changelog.segments import puts_whole
from pgcdc.connection.server_errors import invalidation_cause
from pgcdc.connection.sql import SlotInfo
from pgcdc.errors import (
    ChangeLogError,
    SlotInvalidated,
    SlotNotFound,
    SlotNotSynced,
    SlotReplaced,
    TimelineDiverged,
)
from pgcdc.lsn import LSN
from pgcdc.storage import StorageOptions

__all__ = [
    "SNAPSHOT_PENDING_NAME",
    "STATE_NAME",
    "ConfirmGuard",
    "PendingSnapshot",
    "ServerTimeline",
    "SlotOrigin",
    "clear_snapshot_pending",
    "load_origin",
    "mark_snapshot_pending",
    "save_origin",
    "snapshot_pending",
    "verify",
]

STATE_NAME = "pgcdc-slot.json"
# Written before the initial snapshot creates its slot, removed once the snapshot is in the
# log and the origin recorded: a slot found with this file present was created by a snapshot
# that never completed (a crash), so it may be dropped and the snapshot taken again.
SNAPSHOT_PENDING_NAME = "pgcdc-snapshot-pending.json"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotOrigin:
    """The slot a change log is filled from (see the module docstring)."""

    slot: str
    database: str
    created_lsn: LSN  # the slot's consistent point, or its position when pgcdc first met it
    confirmed_bound: LSN  # no confirmation pgcdc sent to this slot passes this
    # IDENTIFY_SYSTEM's, when last checked (None in records written before they were kept).
    system_id: int | None = None
    timeline: int | None = None
    # The slot was met on a server in recovery (decoding on a standby): it is that server's
    # own, so a promotion of that server keeps it (see the module docstring).
    on_standby: bool = False

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["created_lsn"] = str(self.created_lsn)
        data["confirmed_bound"] = str(self.confirmed_bound)
        if self.system_id is not None:  # a JSON number loses the low digits of a uint64
            data["system_id"] = str(self.system_id)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SlotOrigin:
        data = json.loads(text)
        system_id, timeline = data.get("system_id"), data.get("timeline")
        return cls(
            slot=str(data["slot"]),
            database=str(data["database"]),
            created_lsn=LSN.parse(data["created_lsn"]),
            confirmed_bound=LSN.parse(data["confirmed_bound"]),
            system_id=None if system_id is None else int(system_id),
            timeline=None if timeline is None else int(timeline),
            on_standby=bool(data.get("on_standby", False)),
        )


@dataclass(frozen=True)
class ServerTimeline:
    """Where the server stands: IDENTIFY_SYSTEM's system identifier and timeline, and from
    TIMELINE_HISTORY where each earlier timeline of its history ended."""

    system_id: int
    timeline: int
    switchpoints: Mapping[int, LSN] = field(default_factory=dict)


def _read(log_root: str, name: str, storage: StorageOptions | None) -> tuple[str, str] | None:
    """The path and text of the file ``name`` beside the change log, or None if there is none."""
    changelog = ChangeLog(log_root, storage=storage)
    path = f"{changelog.root}/{name}"
    try:
        with changelog.filesystem.open_input_stream(path) as stream:
            return path, stream.read().decode()
    except FileNotFoundError:
        return None


def load_origin(log_root: str, storage: StorageOptions | None = None) -> SlotOrigin | None:
    """The recorded origin of the change log at ``log_root``, or None (none recorded yet)."""
    found = _read(log_root, STATE_NAME, storage)
    if found is None:
        return None
    path, text = found
    try:
        return SlotOrigin.from_json(text)
    except (ValueError, KeyError, TypeError) as error:
        raise ChangeLogError(
            f"{path} is damaged ({type(error).__name__}: {error}), so the slot this change log "
            "is filled from cannot be checked; restore the file from a backup, or start over "
            "with new, empty paths.changelog, paths.lake and paths.checkpoint"
        ) from None


def save_origin(log_root: str, origin: SlotOrigin, storage: StorageOptions | None = None) -> None:
    """Replace the record atomically (a new file renamed over the old and synced when local;
    one PUT on S3 and GCS)."""
    _replace(log_root, STATE_NAME, origin.to_json().encode(), storage)


@dataclass(frozen=True)
class PendingSnapshot:
    """An initial snapshot under way: the slot it creates, and once created, its consistent
    point (where its stream starts; a snapshot the executors land can resume from it)."""

    slot: str
    consistent_point: LSN | None = None


def mark_snapshot_pending(
    log_root: str,
    slot: str,
    storage: StorageOptions | None = None,
    consistent_point: LSN | None = None,
) -> None:
    """Record, durably, that an initial snapshot is about to create ``slot`` (or has created
    it, at ``consistent_point``)."""
    record: dict[str, str] = {"slot": slot}
    if consistent_point is not None:
        record["consistent_point"] = str(LSN(consistent_point))
    _replace(log_root, SNAPSHOT_PENDING_NAME, json.dumps(record).encode(), storage)


def snapshot_pending(
    log_root: str, storage: StorageOptions | None = None
) -> PendingSnapshot | None:
    """The initial snapshot a crash interrupted (its slot may exist), else None."""
    found = _read(log_root, SNAPSHOT_PENDING_NAME, storage)
    if found is None:
        return None
    path, text = found
    try:
        record = json.loads(text)
        point = record.get("consistent_point")
        return PendingSnapshot(str(record["slot"]), None if point is None else LSN.parse(point))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ChangeLogError(
            f"{path} is damaged ({type(error).__name__}: {error}); it only records that an "
            "initial snapshot was under way: delete it, drop the slot that snapshot created "
            "(if it exists) and start again"
        ) from None


def clear_snapshot_pending(log_root: str, storage: StorageOptions | None = None) -> None:
    changelog = ChangeLog(log_root, storage=storage)
    with contextlib.suppress(FileNotFoundError):
        changelog.filesystem.delete_file(f"{changelog.root}/{SNAPSHOT_PENDING_NAME}")


def _replace(log_root: str, name: str, data: bytes, storage: StorageOptions | None = None) -> None:
    """Write ``name`` in the log's directory atomically (synced when local; one PUT on S3
    and GCS)."""
    changelog = ChangeLog(log_root, storage=storage)
    fs, root = changelog.filesystem, changelog.root
    path, temporary = f"{root}/{name}", f"{root}/{name}.tmp"
    if isinstance(fs, pafs.LocalFileSystem):
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        directory = os.open(root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return
    if puts_whole(fs):
        with fs.open_output_stream(path) as stream:
            stream.write(data)
        return
    with fs.open_output_stream(temporary) as stream:
        stream.write(data)
    fs.move(temporary, path)


class ConfirmGuard:
    """The receiver's ``on_confirm``: records each position before it is confirmed to the
    slot in ``origin`` (None until the slot is claimed: then nothing streams)."""

    def __init__(
        self,
        log_root: str,
        origin: SlotOrigin | None = None,
        storage: StorageOptions | None = None,
    ) -> None:
        self._root = log_root
        self._storage = storage
        self.origin = origin

    def __call__(self, lsn: LSN) -> None:
        origin = self.origin
        if origin is not None and lsn > origin.confirmed_bound:
            self.origin = replace(origin, confirmed_bound=LSN(lsn))
            save_origin(self._root, self.origin, self._storage)


def _start_over(slot: str) -> str:
    return (
        "start over: stop the pipeline, drop the slot if it exists (SELECT "
        f"pg_drop_replication_slot('{slot}')), and run it with new, empty paths.changelog, "
        "paths.lake and paths.checkpoint (or move those three away) and snapshot = "
        '"initial": it creates the slot again and copies the tables anew'
    )


def verify(
    origin: SlotOrigin | None,
    slot: SlotInfo | None,
    *,
    name: str,
    database: str,
    log_end: LSN,
    server: ServerTimeline | None = None,
) -> SlotOrigin:
    """Check that ``slot`` can go on filling a change log that holds transactions up to
    ``log_end`` (``origin``: its record, None for a log filled before records were kept) on
    ``server``; the origin to keep on recording, or a typed error saying how to start over."""
    if origin is not None and (origin.slot, origin.database) != (name, database):
        raise SlotReplaced(
            f"the change log was filled from slot {origin.slot!r} of database "
            f"{origin.database!r}, not slot {name!r} of {database!r}: another slot would start "
            f"at another position, leaving a gap or duplicates; use slot {origin.slot!r} of "
            f"{origin.database!r} with this change log, or {_start_over(name)}"
        )
    switched_at = _timeline_switch(origin, server, name=name)
    if slot is None:
        if switched_at is not None:
            assert origin is not None and server is not None
            raise SlotNotSynced(
                f"replication slot {name!r} is not on this server, promoted from a standby "
                f"(timeline {origin.timeline} ended at {switched_at}; it is now on timeline "
                f"{server.timeline}): the slot was not a failover slot (failover = false, or "
                "created before PostgreSQL 17) or the standby had not synchronized it yet "
                "(sync_replication_slots, see pgcdc check --standby), so the changes since the "
                f"change log's end ({log_end}) cannot be streamed and a new slot would leave a "
                f"gap; {_start_over(name)}"
            )
        raise SlotNotFound(
            f"replication slot {name!r}, which this change log (complete up to {log_end}) was "
            "filled from, no longer exists: a new slot would start after the changes made "
            f"since, a gap nothing could fill, so pgcdc will not create one; {_start_over(name)}"
        )
    # The promoted server is the standby the slot was created on, and pgcdc streamed from it
    # through the promotion: what the log holds past the switch is that server's new timeline.
    streamed_through_promotion = (
        switched_at is not None
        and log_end > switched_at
        and origin is not None
        and origin.on_standby
        and not slot.synced
    )
    if switched_at is not None and log_end > switched_at and not streamed_through_promotion:
        assert origin is not None and server is not None
        raise TimelineDiverged(
            f"the change log holds changes up to {log_end}, but timeline {origin.timeline} "
            f"ended at {switched_at} when this server (now on timeline {server.timeline}) was "
            "promoted: the standby had not received the changes in between, so the source "
            "lost them while the change log and the lake keep them. Set "
            "synchronized_standby_slots on the primary to the standbys' physical slots, so that "
            f"pgcdc never receives what a standby has not (pgcdc check --standby); now "
            f"{_start_over(name)}"
        )
    if streamed_through_promotion:
        assert origin is not None and server is not None
        log.warning(
            "timeline switch (a promotion of the standby slot %r was created on): timeline %s "
            "ended at %s; the server is now on timeline %s; the change log, up to %s, was "
            "filled from that same slot through the promotion, so it goes on from there",
            name,
            origin.timeline,
            switched_at,
            server.timeline,
            log_end,
        )
    elif switched_at is not None:
        assert origin is not None and server is not None
        log.warning(
            "timeline switch (a failover): the change log was filled on timeline %s, which "
            "ended at %s; the server is now on timeline %s; the log ends at %s, before the "
            "switch, so slot %r resumes there",
            origin.timeline,
            switched_at,
            server.timeline,
            log_end,
            name,
        )
    if slot.invalidated:
        raise SlotInvalidated(
            f"replication slot {name!r} was invalidated ({slot.invalidation_reason}): "
            f"{invalidation_cause(slot.invalidation_reason)}, so the changes after {log_end}, "
            f"where this change log ends, can no longer be streamed; {_start_over(name)}"
        )
    confirmed = slot.confirmed_flush_lsn
    bound = origin.confirmed_bound if origin is not None else log_end
    if confirmed is None or confirmed > bound:
        what = (
            f"never confirmed past {bound}"
            if origin is not None
            else f"holds transactions up to {log_end} only (and records no slot)"
        )
        raise SlotReplaced(
            f"replication slot {name!r} starts at {confirmed}, but the change log it would fill "
            f"{what}: the slot was dropped and created again (or advanced by another client), "
            f"so the changes in between are missing and would stay missing; {_start_over(name)}"
        )
    if origin is None:
        log.info("the change log records slot %r from now on (at %s)", name, confirmed)
        origin = SlotOrigin(name, database, confirmed, confirmed)
    if server is not None:
        origin = replace(origin, system_id=server.system_id, timeline=server.timeline)
    return origin


def _timeline_switch(
    origin: SlotOrigin | None, server: ServerTimeline | None, *, name: str
) -> LSN | None:
    """Where the recorded timeline ended, when the server has moved on to a later one (None
    when it has not). Raises when the server is another cluster, or when the recorded timeline
    is not in its history."""
    if origin is None or server is None:
        return None
    if origin.system_id is not None and origin.system_id != server.system_id:
        raise SlotReplaced(
            f"the change log was filled from a server with system identifier {origin.system_id}, "
            f"but this one is {server.system_id}: another cluster (not a standby made from "
            "that server) whose slot would start at another position; connect to the server "
            f"the log was filled from (or one of its standbys), or {_start_over(name)}"
        )
    if origin.timeline is None or origin.timeline == server.timeline:
        return None
    switched_at = server.switchpoints.get(origin.timeline)
    if switched_at is None:
        raise TimelineDiverged(
            f"the change log was filled on timeline {origin.timeline}, which is not in the "
            f"history of this server's timeline {server.timeline}: it is not a successor of "
            "the server the log was filled from (an old primary started again after a "
            "failover?); connect to the current primary (list every host in the conninfo with "
            f"target_session_attrs=primary), or {_start_over(name)}"
        )
    return switched_at
