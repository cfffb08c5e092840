"""TLS with sslmode=verify-full against a CA made here with the openssl CLI.

The embedded PostgreSQL 18 build has no SSL support; on it these tests skip, but only when the
server itself refuses ``ssl = on`` with exactly that reason. Any other failure fails loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgcdc.connection.protocol import XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.errors import ConnectionFailed
from pgcdc.localpg import LocalCluster, wait_until
from tests.conftest import TEST_SETTINGS

NO_SSL_IN_BUILD = "SSL is not supported by this build"


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], check=False, cwd=cwd, capture_output=True, text=True
    )
    assert result.returncode == 0, f"openssl {' '.join(args)} failed: {result.stderr}"


def make_ca(directory: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-new", "-nodes", "-days", "2",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN=pgcdc test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_server_cert(directory: Path, ca: str) -> None:
    """A server certificate for 127.0.0.1 only (no DNS names), signed by ``ca``."""
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "req", "-new", "-nodes",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=directory,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tls(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A dedicated cluster serving TLS with a fresh CA; yields the directory of the CA files."""
    pki = tmp_path_factory.mktemp("pki")
    make_ca(pki, "ca")
    make_ca(pki, "other_ca")
    make_server_cert(pki, "ca")
    server = LocalCluster(cluster.installation, settings=TEST_SETTINGS)
    server.start()
    try:
        owner = server.data_dir.stat()
        for name in ("server.crt", "server.key", "ca.crt"):
            target = server.data_dir / name
            shutil.copy(pki / name, target)
            os.chown(target, owner.st_uid, owner.st_gid)
            target.chmod(0o600 if name.endswith(".key") else 0o644)
        with psycopg.connect(server.conninfo(), autocommit=True) as admin:
            for setting, file in (
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.crt"),
            ):
                admin.execute(f"ALTER SYSTEM SET {setting} = '{server.data_dir / file}'")
            try:
                admin.execute("ALTER SYSTEM SET ssl = on")
            except psycopg.errors.InvalidParameterValue as error:
                if str(error) == NO_SSL_IN_BUILD:
                    pytest.skip(
                        f"PostgreSQL {server.major} from {server.installation.bin_dir} refuses "
                        f"ssl=on: {error}"
                    )
                raise
            admin.execute("SELECT pg_reload_conf()")

        def ssl_on() -> bool:
            with psycopg.connect(server.conninfo(sslmode="disable")) as check:
                return check.execute("SHOW ssl").fetchone() == ("on",)

        try:
            wait_until(ssl_on, timeout=30)
        except TimeoutError:
            pytest.fail(f"ssl did not come on; server log:\n{server.server_log()[-3000:]}")
        (pki / "port").write_text(str(server.port))
        yield pki
    finally:
        server.destroy()


def tls_conninfo(pki: Path, **params: str) -> str:
    port = int((pki / "port").read_text())
    defaults = {
        "host": "127.0.0.1",
        "port": str(port),
        "user": "postgres",
        "password": "pgcdc-local",
        "dbname": "postgres",
        "sslmode": "verify-full",
        "sslrootcert": str(pki / "ca.crt"),
    }
    return psycopg.conninfo.make_conninfo("", **{**defaults, **params})


def test_verify_full_streams_over_tls(tls: Path) -> None:
    with ReplicationConnection.connect(tls_conninfo(tls)) as repl:
        assert repl.pgconn.ssl_in_use
        with psycopg.connect(tls_conninfo(tls), autocommit=True) as admin:
            row = admin.execute(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = %s", (repl.pgconn.backend_pid,)
            ).fetchone()
            assert row is not None
            ssl, version = row
            assert ssl is True
            assert version in ("TLSv1.2", "TLSv1.3")
            slot = f"tls_{os.getpid()}"
            repl.create_replication_slot(slot, "test_decoding", temporary=True, snapshot="nothing")
            admin.execute("SELECT pg_logical_emit_message(true, 'pgcdc', 'over tls')")
        stream = repl.start_replication(slot)
        for message in stream:
            assert isinstance(message, XLogData)
            if b"over tls" in bytes(message.payload):
                break
        stream.stop()


def test_verify_full_rejects_an_unknown_ca(tls: Path) -> None:
    with pytest.raises(ConnectionFailed, match="certificate verify failed"):
        ReplicationConnection.connect(tls_conninfo(tls, sslrootcert=str(tls / "other_ca.crt")))


def test_verify_full_rejects_a_name_the_certificate_lacks(tls: Path) -> None:
    # The certificate names 127.0.0.1 only; "localhost" reaches the same server but must fail.
    with pytest.raises(ConnectionFailed, match="does not match host name"):
        ReplicationConnection.connect(tls_conninfo(tls, host="localhost"))
