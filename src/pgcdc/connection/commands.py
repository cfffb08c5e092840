"""Replication command text and typed results, for the server version at hand.

Pure functions: each builder returns the command text with the parser of its result, and the
drivers in ``pgcdc.connection.replication`` run it. Names (slots, plugins, options) are sent as
double-quoted identifiers and option values as single-quoted literals, so no value can change
the command's meaning. A feature the server lacks raises UnsupportedFeature before anything is
sent, rather than a syntax error from the server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

from pgcdc.errors import (
    InvalidArgument,
    PgcdcError,
    ProtocolError,
    ServerError,
    SlotNotFound,
    UnsupportedFeature,
)
from pgcdc.lsn import LSN

T = TypeVar("T")

SnapshotAction: TypeAlias = Literal["export", "use", "nothing"]
OptionValue: TypeAlias = str | int | bool | None
Options: TypeAlias = Mapping[str, OptionValue] | Iterable[tuple[str, OptionValue]]
# (sqlstate, message, detail) of a server ErrorResponse -> the error to raise.
ErrorMapper: TypeAlias = Callable[[str | None, str, str | None], PgcdcError]

# The first server version of each feature (PostgreSQL numbers versions as major * 10000).
NEW_OPTION_SYNTAX = 15  # CREATE_REPLICATION_SLOT ... (SNAPSHOT 'x', TWO_PHASE true)
TWO_PHASE_SLOTS = 15
READ_REPLICATION_SLOT = 15
ALTER_REPLICATION_SLOT = 17
FAILOVER_SLOTS = 17
ALTER_TWO_PHASE = 18

_OLD_SNAPSHOT_KEYWORDS: dict[str, str] = {
    "export": "EXPORT_SNAPSHOT",
    "use": "USE_SNAPSHOT",
    "nothing": "NOEXPORT_SNAPSHOT",
}
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*")


@dataclass(frozen=True, slots=True)
class ResultSet:
    """Rows of a command's result as the server sent them (text format, raw bytes)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[bytes | None, ...], ...]
    encoding: str = "utf-8"

    def text(self, row: int, column: int) -> str | None:
        value = self.rows[row][column]
        return None if value is None else value.decode(self.encoding)


@dataclass(frozen=True, slots=True)
class Command(Generic[T]):
    """A replication command: the text to send and how to read its result.

    ``translate_error`` overrides pgcdc.connection.server_errors.translate where that general
    mapping would mislead for this command.
    """

    text: str
    parse: Callable[[ResultSet], T]
    translate_error: ErrorMapper | None = None


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    system_id: int
    timeline: int
    xlogpos: LSN
    # None on a physical replication connection (not bound to a database).
    dbname: str | None


@dataclass(frozen=True, slots=True)
class TimelineHistory:
    filename: str
    content: bytes

    def switchpoints(self) -> dict[int, LSN]:
        """Each earlier timeline of this history and the WAL position where it ended (the
        server's history file: "parent timeline, switch point, reason" per line, # comments).
        Raises ProtocolError on a line that is not in that form."""
        ends: dict[int, LSN] = {}
        for line in self.content.decode("utf-8", "replace").splitlines():
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            try:
                ends[int(fields[0])] = LSN.parse(fields[1])
            except (IndexError, ValueError):
                raise ProtocolError(
                    f"timeline history {self.filename} has a line that is not "
                    f"'<timeline> <switch point> <reason>': {line!r}"
                ) from None
        return ends


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    slot_name: str
    consistent_point: LSN
    # Set only with snapshot="export"; valid until the next command on the same connection.
    snapshot_name: str | None
    output_plugin: str | None


@dataclass(frozen=True, slots=True)
class SlotPosition:
    """READ_REPLICATION_SLOT: where a physical slot would restart streaming."""

    slot_type: str
    restart_lsn: LSN | None
    restart_tli: int | None


# --- quoting ---------------------------------------------------------------------------------


def _check_sendable(kind: str, value: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(f"{kind} {value!r} contains a NUL character, which cannot be sent")
    if not value:
        raise InvalidArgument(f"{kind} must not be empty")


def quote_identifier(name: str, kind: str = "identifier") -> str:
    """A double-quoted identifier, as the replication grammar reads it (case kept)."""
    _check_sendable(kind, name)
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """A single-quoted string literal: quotes doubled; backslashes are not escapes here."""
    if "\x00" in value:
        raise InvalidArgument(f"option value {value!r} contains a NUL character")
    return "'" + value.replace("'", "''") + "'"


def _option_text(value: OptionValue) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- version checks --------------------------------------------------------------------------


def supports_failover(server_version: int) -> bool:
    """Whether the server can create failover slots (synchronized to physical standbys)."""
    return major_version(server_version) >= FAILOVER_SLOTS


def major_version(server_version: int) -> int:
    """The major version of libpq's PQserverVersion (150004 -> 15; 90624, i.e. 9.6, -> 9)."""
    return server_version // 10000


def _require(server_version: int, needed: int, feature: str) -> None:
    major = major_version(server_version)
    if major < needed:
        raise UnsupportedFeature(
            f"{feature} needs PostgreSQL {needed} or later; this server is PostgreSQL {major}. "
            f"Upgrade the server or do without {feature}"
        )


# --- result checks ---------------------------------------------------------------------------


def _single_row(result: ResultSet, command: str, columns: int) -> tuple[bytes | None, ...]:
    if len(result.rows) != 1 or len(result.columns) < columns:
        raise ProtocolError(
            f"{command} returned {len(result.rows)} rows of {len(result.columns)} columns; "
            f"expected one row of at least {columns}"
        )
    return result.rows[0]


def _required(result: ResultSet, command: str, column: int) -> str:
    value = result.text(0, column)
    if value is None:
        raise ProtocolError(f"{command} returned NULL for {result.columns[column]}")
    return value


def _lsn(text: str, command: str) -> LSN:
    try:
        return LSN.parse(text)
    except ValueError as error:
        raise ProtocolError(f"{command} returned an invalid LSN: {error}") from None


def _int(text: str, command: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ProtocolError(f"{command} returned {text!r} where a number was expected") from None


def _no_result(result: ResultSet) -> None:
    return None


# --- the commands ----------------------------------------------------------------------------


def identify_system() -> Command[SystemIdentity]:
    def parse(result: ResultSet) -> SystemIdentity:
        _single_row(result, "IDENTIFY_SYSTEM", 4)
        command = "IDENTIFY_SYSTEM"
        return SystemIdentity(
            system_id=_int(_required(result, command, 0), command),
            timeline=_int(_required(result, command, 1), command),
            xlogpos=_lsn(_required(result, command, 2), command),
            dbname=result.text(0, 3),
        )

    return Command("IDENTIFY_SYSTEM", parse)


def show(name: str) -> Command[str]:
    """SHOW a server setting (e.g. wal_sender_timeout), as the server formats it."""
    if not _SETTING_NAME.fullmatch(name):
        raise InvalidArgument(
            f"{name!r} is not a setting name; use letters, digits, '_' and '.' (e.g. "
            "'wal_sender_timeout' or 'myext.option')"
        )

    def parse(result: ResultSet) -> str:
        _single_row(result, "SHOW", 1)
        return _required(result, "SHOW", 0)

    return Command("SHOW " + ".".join(quote_identifier(part) for part in name.split(".")), parse)


def timeline_history(timeline: int) -> Command[TimelineHistory]:
    """The history file of ``timeline`` (timeline 1 has none: the server reports an error)."""
    if not 1 <= timeline <= 0xFFFFFFFF:
        raise InvalidArgument(f"timeline must be between 1 and 4294967295, got {timeline}")

    def parse(result: ResultSet) -> TimelineHistory:
        row = _single_row(result, "TIMELINE_HISTORY", 2)
        content = row[1]
        if content is None:
            raise ProtocolError("TIMELINE_HISTORY returned NULL content")
        # The server sends the file's bytes as they are, not bytea-escaped.
        return TimelineHistory(_required(result, "TIMELINE_HISTORY", 0), bytes(content))

    def translate_error(sqlstate: str | None, message: str, detail: str | None) -> PgcdcError:
        # The general mapping gives a plain ServerError for this 58P01; this adds the fix.
        return ServerError(
            f"{message}; timeline {timeline} has no history file on this server (timeline 1 "
            "never has one; see IDENTIFY_SYSTEM for the current timeline)",
            sqlstate=sqlstate,
            detail=detail,
        )

    return Command(f"TIMELINE_HISTORY {timeline}", parse, translate_error)


def create_replication_slot(
    server_version: int,
    slot_name: str,
    output_plugin: str,
    *,
    temporary: bool = False,
    snapshot: SnapshotAction | None = None,
    two_phase: bool = False,
    failover: bool = False,
) -> Command[CreatedSlot]:
    """CREATE_REPLICATION_SLOT for a logical slot.

    ``snapshot`` None leaves the server's default (export). Two-phase needs PostgreSQL 15,
    failover 17; the option list syntax is used from 15, the keyword syntax before.
    """
    if snapshot is not None and snapshot not in _OLD_SNAPSHOT_KEYWORDS:
        raise InvalidArgument(f"snapshot must be 'export', 'use' or 'nothing', not {snapshot!r}")
    if two_phase:
        _require(server_version, TWO_PHASE_SLOTS, "a two-phase slot (TWO_PHASE)")
    if failover:
        _require(server_version, FAILOVER_SLOTS, "a failover slot (FAILOVER)")
    parts = ["CREATE_REPLICATION_SLOT", quote_identifier(slot_name, "slot name")]
    if temporary:
        parts.append("TEMPORARY")
    parts += ["LOGICAL", quote_identifier(output_plugin, "output plugin")]
    if major_version(server_version) >= NEW_OPTION_SYNTAX:
        options = []
        if snapshot is not None:
            options.append(f"SNAPSHOT {quote_literal(snapshot)}")
        if two_phase:
            options.append("TWO_PHASE true")
        if failover:
            options.append("FAILOVER true")
        if options:
            parts.append("(" + ", ".join(options) + ")")
    elif snapshot is not None:
        parts.append(_OLD_SNAPSHOT_KEYWORDS[snapshot])

    def parse(result: ResultSet) -> CreatedSlot:
        command = "CREATE_REPLICATION_SLOT"
        _single_row(result, command, 4)
        return CreatedSlot(
            slot_name=_required(result, command, 0),
            consistent_point=_lsn(_required(result, command, 1), command),
            snapshot_name=result.text(0, 2),
            output_plugin=result.text(0, 3),
        )

    return Command(" ".join(parts), parse)


def read_replication_slot(server_version: int, slot_name: str) -> Command[SlotPosition]:
    """READ_REPLICATION_SLOT (PostgreSQL 15+, physical slots only); SlotNotFound if missing."""
    _require(server_version, READ_REPLICATION_SLOT, "READ_REPLICATION_SLOT")
    text = "READ_REPLICATION_SLOT " + quote_identifier(slot_name, "slot name")

    def parse(result: ResultSet) -> SlotPosition:
        command = "READ_REPLICATION_SLOT"
        _single_row(result, command, 3)
        slot_type = result.text(0, 0)
        if slot_type is None:  # the server answers a missing slot with a row of NULLs
            raise SlotNotFound(
                f'replication slot "{slot_name}" does not exist; create it first '
                "(pg_create_physical_replication_slot)"
            )
        restart_lsn = result.text(0, 1)
        restart_tli = result.text(0, 2)
        return SlotPosition(
            slot_type=slot_type,
            restart_lsn=None if restart_lsn is None else _lsn(restart_lsn, command),
            restart_tli=None if restart_tli is None else _int(restart_tli, command),
        )

    return Command(text, parse)


def alter_replication_slot(
    server_version: int,
    slot_name: str,
    *,
    two_phase: bool | None = None,
    failover: bool | None = None,
) -> Command[None]:
    """ALTER_REPLICATION_SLOT (PostgreSQL 17+; changing two_phase needs 18)."""
    _require(server_version, ALTER_REPLICATION_SLOT, "ALTER_REPLICATION_SLOT")
    options = []
    if failover is not None:
        options.append(f"FAILOVER {'true' if failover else 'false'}")
    if two_phase is not None:
        _require(server_version, ALTER_TWO_PHASE, "changing two_phase of an existing slot")
        options.append(f"TWO_PHASE {'true' if two_phase else 'false'}")
    if not options:
        raise InvalidArgument("ALTER_REPLICATION_SLOT needs two_phase or failover to change")
    text = (
        f"ALTER_REPLICATION_SLOT {quote_identifier(slot_name, 'slot name')} ({', '.join(options)})"
    )
    return Command(text, _no_result)


def drop_replication_slot(slot_name: str, *, wait: bool = False) -> Command[None]:
    """DROP_REPLICATION_SLOT; ``wait`` waits for an active slot to be released."""
    text = f"DROP_REPLICATION_SLOT {quote_identifier(slot_name, 'slot name')}"
    return Command(text + " WAIT" if wait else text, _no_result)


def start_replication(slot_name: str, start_lsn: LSN, options: Options = ()) -> str:
    """START_REPLICATION for a logical slot; the server answers by entering COPY-BOTH.

    ``start_lsn`` 0/0 starts at the slot's confirmed_flush_lsn. Option values are sent as
    string literals (booleans as 'true'/'false'); None sends the option name alone.
    """
    items = options.items() if isinstance(options, Mapping) else options
    rendered = []
    for name, value in items:
        text_value = _option_text(value)
        option = quote_identifier(name, "option name")
        rendered.append(option if text_value is None else f"{option} {quote_literal(text_value)}")
    text = (
        f"START_REPLICATION SLOT {quote_identifier(slot_name, 'slot name')} "
        f"LOGICAL {LSN(start_lsn)}"
    )
    return f"{text} ({', '.join(rendered)})" if rendered else text
