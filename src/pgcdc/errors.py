"""The typed errors pgcdc raises. Each says what is wrong and how to fix it."""

from __future__ import annotations


class PgcdcError(Exception):
    """Base class of every error pgcdc raises on purpose."""


# --- configuration and preflight -------------------------------------------------------------


class ConfigurationError(PgcdcError):
    """The server, role or slot is not set up for logical decoding; the message says the fix."""


class WalLevelNotLogical(ConfigurationError):
    pass


class NoFreeReplicationSlot(ConfigurationError):
    pass


class NoFreeWalSender(ConfigurationError):
    pass


class MissingReplicationPrivilege(ConfigurationError):
    pass


class SlotInUse(ConfigurationError):
    def __init__(self, message: str, *, slot: str, active_pid: int | None) -> None:
        super().__init__(message)
        self.slot = slot
        self.active_pid = active_pid


class SlotNotFound(ConfigurationError):
    pass


class SlotAlreadyExists(ConfigurationError):
    pass


class SlotInvalidated(ConfigurationError):
    pass


class PublicationNotFound(ConfigurationError):
    pass


class PluginNotInstalled(ConfigurationError):
    pass


class UnsupportedFeature(ConfigurationError):
    """A command or option needs a newer server or protocol than the one in use."""


# --- the server said no ----------------------------------------------------------------------


class ServerError(PgcdcError):
    """An ErrorResponse from the server: the SQLSTATE and its message, as the server sent them."""

    def __init__(self, message: str, *, sqlstate: str | None, detail: str | None = None) -> None:
        text = f"{message} (SQLSTATE {sqlstate})" if sqlstate else message
        if detail:
            text += f"\nDETAIL: {detail}"
        super().__init__(text)
        self.sqlstate = sqlstate
        self.server_message = message
        self.detail = detail


class ReplicationStreamError(ServerError):
    """The server ended a replication stream with an error (slot dropped, walsender killed...)."""


class ConnectionLost(PgcdcError):
    """The connection closed without an ErrorResponse (network failure, server crash)."""


# --- bytes that do not parse -----------------------------------------------------------------


class DecodeError(PgcdcError, ValueError):
    """Bytes from the server (or a log file) do not form a valid message of the expected kind."""


class ProtocolError(DecodeError):
    """A COPY-BOTH replication sub-protocol message is malformed or unexpected."""


class UnknownRelation(DecodeError):
    """A change names a relation whose Relation message the decoder has not seen: decoding began
    mid-stream without the state that went with that position."""

    def __init__(self, message: str, *, relation_oid: int) -> None:
        super().__init__(message)
        self.relation_oid = relation_oid


# --- connection (pgcdc.connection.replication) -----------------------------------------------


class InvalidArgument(PgcdcError, ValueError):
    """A value pgcdc was asked to send cannot be sent as given (e.g. a NUL byte in a name)."""


class ConnectionFailed(PgcdcError):
    """Could not open a connection (unreachable host, TLS verification, refused by server)."""


class AuthenticationFailed(ConnectionFailed):
    """The server rejected the credentials; check the password, .pgpass and pg_hba.conf."""
