"""The oracle test: pgcdc's lake against PostgreSQL's own logical-replication subscriber.

A second cluster of the same version subscribes natively to the publication that
``pgcdc pipeline run --once`` reads. A seeded random workload runs on the publisher (two
sessions; inserts, updates incl. key changes and updates leaving TOASTed values unchanged,
deletes, TRUNCATE, savepoint rollbacks, aborted and two-phase transactions, a streamed
transaction, ADD/DROP COLUMN) over every core type's edge values (``specs.py``) in keys,
REPLICA IDENTITY FULL rows with duplicates and TOASTed columns, in tables whose names have
spaces, quotes, mixed case and non-ASCII. Once the subscriber has caught up and the pipeline
has drained, the Delta mirror and the current rows of the history must equal the subscriber's
tables, value for value in PostgreSQL's text form, and the Delta changelog must equal
test_decoding's changes one for one. A failure lists every differing value by table, row and
column.

Parametrized over PG15/PG18 (``cluster``) and pgoutput text and binary, plus one run (PG15) in
text with hostile server settings on the source database.

Knobs (environment), to narrow the coverage while defects stop the whole pipeline: see
``specs.py`` (``PGCDC_ORACLE_SKIP_COLUMNS``, ``PGCDC_ORACLE_SKIP_VALUES``, ``PGCDC_ORACLE_NAMES``,
``PGCDC_ORACLE_KINDS``); ``PGCDC_ORACLE_SEED``, ``PGCDC_ORACLE_TRANSACTIONS``,
``PGCDC_ORACLE_STREAMED_ROWS`` size the workload; ``PGCDC_ORACLE_REPORT=file`` appends each
run's full mismatch list to a file.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest
from psycopg import sql

from pgcdc import pipeline
from pgcdc.localpg import LocalCluster
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database
from tests.spark.helpers import slot_streamed

from .changelog import compare_changelogs
from .compare import (
    Report,
    fix_settings,
    lake_path,
    lake_texts,
    subscriber_rows,
    table_columns,
)
from .specs import TableSpec
from .specs import tables as oracle_tables
from .workload import Workload, create_schema

SEED = int(os.environ.get("PGCDC_ORACLE_SEED", "10"))
TRANSACTIONS = int(os.environ.get("PGCDC_ORACLE_TRANSACTIONS", "400"))
STREAMED_ROWS = int(os.environ.get("PGCDC_ORACLE_STREAMED_ROWS", "200"))

HOSTILE = {
    "extra_float_digits": "0",
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "sql_standard",
    "TimeZone": "America/St_Johns",
    "bytea_output": "escape",
}
HOSTILE_MAJOR = 15
PIPELINE_SLOT = "oracle"
DECODING_SLOT = "oracle_td"
SUBSCRIPTION = "oracle_sub"


def _wait_caught_up(
    publisher: psycopg.Connection[Any],
    subscriber: psycopg.Connection[Any],
    tables: list[TableSpec],
    sub_cluster: LocalCluster,
    timeout: float = 120.0,
) -> None:
    """Until every table holds the same rows on both sides (the publisher is idle now)."""

    def digest(conn: psycopg.Connection[Any], table: TableSpec) -> Any:
        query = sql.SQL("SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {} t")
        return conn.execute(query.format(sql.Identifier(table.schema, table.name))).fetchone()

    deadline = time.monotonic() + timeout
    while True:
        try:
            fix_settings(publisher)
            fix_settings(subscriber)
            behind = [t.label for t in tables if digest(publisher, t) != digest(subscriber, t)]
        except psycopg.OperationalError as exc:  # a server went down: say which, and why
            raise AssertionError(
                f"lost a connection while waiting for the subscriber ({exc}); the subscriber's "
                f"log ends with:\n{sub_cluster.server_log()[-3000:]}"
            ) from None
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the subscriber did not catch up on {behind}; its log ends with:\n"
                + sub_cluster.server_log()[-3000:]
            )
        time.sleep(0.3)


def _current(data: Any) -> Any:
    return data.filter(pc.equal(data.column("_is_current"), True))


@pytest.mark.parametrize("mode", ["text", "binary", "hostile"])
def test_lake_equals_the_native_subscriber(
    db: Database,
    subscriber_cluster: LocalCluster,
    spark: Any,
    tmp_path: Path,
    mode: str,
) -> None:
    if mode == "hostile" and db.major != HOSTILE_MAJOR:
        pytest.skip(f"the hostile-settings run is one run, on PG{HOSTILE_MAJOR} (suite time)")
    binary = mode == "binary"
    tables = oracle_tables()
    with psycopg.connect(subscriber_cluster.conninfo(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.name)))
    sub_conninfo = subscriber_cluster.conninfo(db.name)
    with db.connect() as pub, psycopg.connect(sub_conninfo, autocommit=True) as sub:
        for conn in (pub, sub):
            create_schema(conn, tables, db.major)
        pub.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        settings_sql = {
            "logical_decoding_work_mem": "64kB",
            **(HOSTILE if mode == "hostile" else {}),
        }
        for name, value in settings_sql.items():
            pub.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(db.name), sql.Identifier(name), sql.Literal(value)
                )
            )
        pub.execute(f"SELECT pg_create_logical_replication_slot('{PIPELINE_SLOT}', 'pgoutput')")
        pub.execute(
            f"SELECT pg_create_logical_replication_slot('{DECODING_SLOT}', 'test_decoding')"
        )
        sub.execute(
            sql.SQL(
                "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION pub "
                "WITH (copy_data = false, streaming = on)"
            ).format(sql.Identifier(SUBSCRIPTION), sql.Literal(db.conninfo()))
        )
        try:
            with db.connect() as a, db.connect() as b:

                def add_column(ddl: str) -> None:
                    sub.execute(ddl)

                def drop_column(ddl: str) -> None:
                    _wait_caught_up(pub, sub, tables, subscriber_cluster)
                    sub.execute(ddl)

                workload = Workload(
                    random.Random(SEED * 1000 + db.major),
                    (a, b),
                    tables,
                    db.major,
                    on_add_column=add_column,
                    on_drop_column=drop_column,
                )
                workload.run(TRANSACTIONS, STREAMED_ROWS)
            _wait_caught_up(pub, sub, tables, subscriber_cluster)

            # The settings as a user writes them: binary is a [source] key of the TOML file.
            config = tmp_path / "pipeline.toml"
            config.write_text(
                "[source]\n"
                f"conninfo = {json.dumps(db.conninfo())}\n"
                f"slot = {json.dumps(PIPELINE_SLOT)}\n"
                'publications = ["pub"]\n'
                "create_slot = false\n"
                'snapshot = "never"\n'
                f"binary = {'true' if binary else 'false'}\n"
                "[paths]\n"
                f"changelog = {json.dumps(str(tmp_path / 'changelog'))}\n"
                f"lake = {json.dumps(str(tmp_path / 'lake'))}\n"
                f"checkpoint = {json.dumps(str(tmp_path / 'checkpoint'))}\n"
                "[spark]\n"
                'master = "local[2]"\n'
                "trigger_interval = 1.0\n"
            )
            settings = pipeline.load(config, {})
            assert settings.binary == binary
            pipeline.run(settings, once=True, spark=spark)

            report = Report()
            if not slot_streamed(pub, PIPELINE_SLOT):
                report.problem(PIPELINE_SLOT, "no transaction was streamed to the pipeline's slot")
            fix_settings(sub)
            for table in tables:
                columns = table_columns(sub, table.schema, table.name)
                expected = subscriber_rows(sub, table.schema, table.name, columns)
                pair_by = ["id"]
                for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
                    where = f"{kind.value} {table.label}"
                    path = lake_path(settings.lake, table.schema, table.name, kind)
                    if not Path(path).exists():
                        report.problem(where, f"no Delta table at {path}")
                        continue
                    data = read_table(path)
                    if kind is SinkKind.HISTORY:
                        data = _current(data)
                    got = lake_texts(sub, columns, data)
                    report.compare(where, columns, expected, got, pair_by)
            fix_settings(pub)
            compare_changelogs(
                report, pub, sub, lake=settings.lake, tables=tables, slot=DECODING_SLOT
            )
        finally:
            sub.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(SUBSCRIPTION)))

    counts = workload.counts
    print(f"oracle workload ({mode}, PG{db.major}): {counts.changes} changes, {counts.by_case}")
    report_path = os.environ.get("PGCDC_ORACLE_REPORT")
    if report_path:  # one file per run, for reading the whole list outside pytest
        with open(report_path, "a") as out:
            out.write(f"== {mode} PG{db.major}: {counts.changes} changes, {counts.by_case}\n")
            out.write((report.text() if report else "no mismatches") + "\n")
    kinds = {t.kind for t in tables}
    cases = [
        "insert", "update leaving TOAST unchanged", "delete", "savepoint rollback",
        "aborted transaction", "two-phase commit", "streamed transaction", "interleaved sessions",
    ]  # fmt: skip
    cases += ["key change"] if kinds & {"wide", "keys"} else []
    cases += ["update of a TOASTed column"] if kinds & {"wide", "full"} else []
    cases += ["truncate", "add column", "drop column"] if "wide" in kinds else []
    cases += ["duplicate row"] if "full" in kinds else []
    cases += ["near-duplicate key"] if "keys" in kinds else []
    for case in cases:
        assert counts.by_case.get(case), f"the workload never did: {case}"
    assert not report, report.text()
