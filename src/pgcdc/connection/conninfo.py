"""Conninfo handling shared by every pgcdc command: one parser with a typed error, a connect
timeout and a statement timeout by default, and one connect function for pgcdc's own SQL.

Without a connect timeout, libpq waits forever for a host that accepts TCP and never answers
(a half-open firewall, a stopped VM behind a NAT): every command then hangs with no output.
The statement timeout bounds pgcdc's own catalog and preflight queries; it is not set on the
replication connection nor on the snapshot's COPY connections, which legitimately run long.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcdc import errors
from pgcdc.connection import server_errors
from pgcdc.errors import redact

DEFAULT_CONNECT_TIMEOUT = 10  # seconds, unless the conninfo or PGCONNECT_TIMEOUT says otherwise
DEFAULT_STATEMENT_TIMEOUT = 60.0  # seconds, for pgcdc's own catalog/preflight SQL
STATEMENT_TIMEOUT_ENV = "PGCDC_STATEMENT_TIMEOUT"

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_STATEMENT_TIMEOUT",
    "STATEMENT_TIMEOUT_ENV",
    "connect",
    "default_statement_timeout",
    "endpoint",
    "normalize",
    "redact",
    "timed_out",
]


def normalize(base: str = "", **overrides: Any) -> str:
    """One conninfo from ``base`` (keyword/value or URI) and ``overrides`` (non-empty values
    win), with ``connect_timeout`` set unless the conninfo or PGCONNECT_TIMEOUT sets one.

    Raises InvalidArgument (its message redacted) when libpq would reject the string."""
    overrides = {key: value for key, value in overrides.items() if value not in (None, "")}
    try:
        conninfo = make_conninfo(base, **overrides)
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as error:
        raise errors.InvalidArgument(
            f"invalid connection string {base!r}: {str(error).strip()}; give a database name, "
            "'host=... dbname=...' or postgresql://user@host:port/dbname"
        ) from None
    if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
        conninfo = make_conninfo(conninfo, connect_timeout=DEFAULT_CONNECT_TIMEOUT)
    return conninfo


def endpoint(conninfo: str) -> str:
    """``host:port`` as libpq would pick them (conninfo, then PGHOST/PGPORT, then defaults)."""
    try:
        given = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        given = {}
    host = str(given.get("host") or given.get("hostaddr") or os.environ.get("PGHOST") or "")
    port = str(given.get("port") or os.environ.get("PGPORT") or "5432")
    return f"{host or 'localhost'}:{port}"


def timed_out(conninfo: str) -> errors.ConnectionTimedOut:
    """The typed error for a connection that did not complete within connect_timeout."""
    try:
        seconds = conninfo_to_dict(conninfo).get("connect_timeout")
    except psycopg.ProgrammingError:
        seconds = None
    seconds = seconds or os.environ.get("PGCONNECT_TIMEOUT") or "?"
    return errors.ConnectionTimedOut(
        f"the server at {endpoint(conninfo)} did not answer within connect_timeout={seconds} s; "
        "check that host and port are those of a running PostgreSQL server (not another "
        "service or a firewall that swallows packets), or raise connect_timeout in the conninfo "
        "(or PGCONNECT_TIMEOUT)"
    )


def default_statement_timeout() -> float:
    """The default statement timeout in seconds (0: none), from PGCDC_STATEMENT_TIMEOUT."""
    text = os.environ.get(STATEMENT_TIMEOUT_ENV)
    if text is None or not text.strip():
        return DEFAULT_STATEMENT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise errors.InvalidOption(
            f"{STATEMENT_TIMEOUT_ENV}={text!r}: give a number of seconds, 0 for no timeout"
        )
    return value


def connect(
    conninfo: str, *, limit_statements: bool = True, **kwargs: Any
) -> psycopg.Connection[Any]:
    """An autocommit connection for pgcdc's own SQL, with typed errors and (``limit_statements``)
    the default statement timeout unless the session already has one (set by the role, the
    database, the conninfo's ``options`` or PGOPTIONS: the user's setting wins). Pass
    ``limit_statements=False`` for work that may rightly run long (decoding a slot's backlog)."""
    timeout = default_statement_timeout() if limit_statements else 0.0
    try:
        conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
    except psycopg.errors.ConnectionTimeout:
        raise timed_out(conninfo) from None
    except psycopg.Error as error:
        raise server_errors.from_psycopg(error) from None
    if timeout > 0:
        try:
            conn.execute(
                sql.SQL(
                    "SELECT set_config('statement_timeout', {}, false) "
                    "WHERE current_setting('statement_timeout') IN ('0', '0ms')"
                ).format(sql.Literal(f"{int(timeout * 1000)}ms"))
            )
        except psycopg.Error as error:
            conn.close()
            raise server_errors.from_psycopg(error) from None
    return conn
