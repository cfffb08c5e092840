"""Random workloads through the path users run: ``pgcdc.pipeline.run(once=True)`` (the receiver
in its own process on a real walsender, pgoutput at the server's newest protocol (4 on PG18, 3
on PG15), streaming on, two-phase on, binary on and off) into the change log, then Spark into
Delta. A Python model of the workload says which change each statement makes; the Delta
changelog must hold exactly those changes, in order, with every value (new row, old row or key,
unchanged TOAST columns), and the mirror and the history's current rows must equal the source
table value for value.

Each example runs two passes of ``run(once=True)`` over one program; a prepared transaction
followed by a committed one may stay open across the passes (the receiver must not confirm the
slot past its PREPARE, or the server never sends its changes again). The source
database has ``logical_decoding_work_mem = 64kB``, so a bulk transaction (about 100 kB) is
streamed; the test checks the slot did stream one."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgcdc import pipeline
from pgcdc.localpg import LocalCluster
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database, examples, fresh_database

from .helpers import lake_path, slot_streamed

SLOT = "real"
PUBLICATION = "pub"
COLUMNS = {
    "public.items": ("id", "name", "body", "qty", "price", "at", "flag", "data"),
    "public.notes": ("id", "note", "score"),  # REPLICA IDENTITY FULL, no key
    "public.events": ("kind", "payload"),  # no key: changelog only
}
LONG_BODY = 3000  # stored out of line: an UPDATE that leaves it sends it as unchanged TOAST
BULK_ROWS = 400  # x ~210 bytes: over logical_decoding_work_mem (64kB), so it is streamed
BULK_PAYLOAD = "x" * 200

Row = dict[str, Any]


# --- the workload, as hypothesis draws it -----------------------------------------------------


@dataclass(frozen=True)
class Values:
    """What one step writes; ``None`` is SQL NULL."""

    name: str | None = None
    long_body: bool = False
    body_char: str = "b"
    qty: int | None = None
    price: Decimal | None = None
    at: datetime | None = None
    flag: bool | None = None
    data: bytes | None = None
    score: float | None = None

    def body(self) -> str:
        return self.body_char * (LONG_BODY if self.long_body else 3)


ACTIONS = (
    "insert", "update", "update body", "move", "delete", "truncate items",
    "write note", "delete note", "truncate notes", "event",
)  # fmt: skip
Step = tuple[str, int, int, Values]

KINDS = ("commit", "savepoint", "abort", "prepare and commit", "prepare and roll back")


@dataclass(frozen=True)
class Transaction:
    kind: str
    steps: list[Step]
    undone: list[Step] = field(default_factory=list)  # rolled back to a savepoint
    bulk: bool = False  # a bulk insert into events, streamed
    defer: bool = False  # prepared: another commit follows, the decision comes later


text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
values = st.builds(
    Values,
    name=st.none() | text,
    long_body=st.booleans(),
    body_char=st.sampled_from("abcé"),
    qty=st.none() | st.integers(-(2**63), 2**63 - 1),
    price=st.none()
    | st.decimals(-(10**10) + 1, 10**10 - 1, places=2, allow_nan=False, allow_infinity=False),
    at=st.none() | st.datetimes(timezones=st.just(UTC)),
    flag=st.none() | st.booleans(),
    data=st.none() | st.binary(max_size=6),
    score=st.none() | st.floats(allow_nan=False),
)
steps = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, 4), st.integers(0, 4), values),
    min_size=1,
    max_size=4,
)


# Every change the sinks treat apart, in one transaction: a TRUNCATE, inserts, an UPDATE and a
# key change that leave a TOASTed body unchanged, an UPDATE of the body, a DELETE; on the FULL
# table an UPDATE and a DELETE carrying the whole old row. The values are drawn.
COVERAGE: tuple[tuple[str, int, int], ...] = (
    ("insert", 0, 0), ("insert", 1, 0), ("truncate items", 0, 0), ("insert", 0, 0),
    ("insert", 1, 0), ("insert", 2, 0), ("update", 0, 0), ("move", 0, 3), ("update body", 1, 0),
    ("delete", 2, 0), ("write note", 3, 0), ("truncate notes", 0, 0), ("write note", 0, 0),
    ("write note", 1, 0), ("write note", 0, 0), ("delete note", 1, 0), ("event", 0, 0),
)  # fmt: skip


@st.composite
def transactions(draw: st.DrawFn, kind: str, bulk: bool | None = None) -> Transaction:
    covered: list[Step] = []
    if kind == "commit" and bulk:
        # The first body after the TRUNCATE is stored out of line, so it goes unchanged.
        for n, (action, key, other) in enumerate(COVERAGE):
            drawn = draw(values)
            drawn = replace(drawn, long_body=True) if n == 3 else drawn
            covered.append((action, key, other, drawn))
    return Transaction(
        kind,
        covered + draw(steps),
        draw(steps) if kind == "savepoint" else [],
        draw(st.booleans()) if bulk is None else bulk,
        kind.startswith("prepare") and draw(st.booleans()),
    )


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[Transaction], int]:
    """Transactions of every kind (one committed bulk, so one streamed at least) in a random
    order, with a few more; and where the first pass ends."""
    required = [draw(transactions(k, bulk=k == "commit" or None)) for k in KINDS]
    extra = draw(st.lists(st.sampled_from(KINDS).flatmap(transactions), max_size=3))
    program = draw(st.permutations(required + extra))
    return program, draw(st.integers(1, len(program) - 1))


EDGES = (
    Values("", True, "é", -(2**63), Decimal("-9999999999.99"), datetime(1, 1, 1, tzinfo=UTC),
           False, b"", float("inf")),
    Values("ü\\'\"\t\n", False, "a", 2**63 - 1, Decimal("0.01"),
           datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), True, b"\x00\xff",
           -0.0),
    Values(None, True, "b", 0, None, datetime(2000, 2, 29, 12, tzinfo=UTC), None, None,
           5e-324),
)  # fmt: skip


def _edge_steps(actions: tuple[tuple[str, int, int], ...]) -> list[Step]:
    return [(a, k, o, EDGES[n % len(EDGES)]) for n, (a, k, o) in enumerate(actions)]


# Edge values in every kind of change; a streamed transaction that is prepared and stays open
# while the first pass runs (the receiver must hold it, not confirm past its PREPARE); a
# streamed transaction rolled back; a savepoint rolled back over a TRUNCATE.
EDGE_PROGRAM = (
    [
        Transaction("commit", _edge_steps(COVERAGE), bulk=True),
        Transaction("abort", _edge_steps((("delete", 1, 0), ("truncate notes", 0, 0))), bulk=True),
        Transaction(
            "prepare and commit",
            _edge_steps((("update", 3, 0), ("move", 1, 4), ("write note", 0, 0))),
            bulk=True,
            defer=True,
        ),
        Transaction(
            "savepoint",
            _edge_steps((("insert", 2, 0), ("update body", 3, 0))),
            _edge_steps((("truncate items", 0, 0), ("insert", 0, 0))),
        ),
        Transaction("prepare and roll back", _edge_steps((("delete", 3, 0),)), defer=True),
    ],
    3,
)


# --- the model: what PostgreSQL holds and which changes pgoutput sends ------------------------


@dataclass(frozen=True)
class Change:
    table: str
    transaction: int  # position among the transactions that committed changes
    seq: int
    op: str
    new: Row | None
    old: Row | None
    unchanged: tuple[str, ...] = ()


@dataclass
class Model:
    """Runs a program on the source and records the changes the Delta changelog must hold."""

    conn: psycopg.Connection[Any]
    items: dict[int, Row] = field(default_factory=dict)
    notes: dict[int, Row] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    committed: int = 0
    # While a transaction runs: its copies of the tables and its changes so far.
    work: tuple[dict[int, Row], dict[int, Row], list[tuple[Any, ...]]] | None = None
    prepared: tuple[Transaction, str, Any] | None = None
    gids: int = 0

    def run(self, txn: Transaction) -> None:
        self.settle()
        self._begin()
        for step in txn.steps:
            self._step(*step)
        if txn.bulk:
            self._bulk()
        if txn.undone:
            self._execute("SAVEPOINT sp")
            saved = self._copy()
            for step in txn.undone:
                self._step(*step)
            self._execute("ROLLBACK TO SAVEPOINT sp")
            self.work = saved
        if txn.kind == "abort":
            self._execute("ROLLBACK")
            self.work = None
        elif txn.kind.startswith("prepare"):
            self.gids += 1
            gid = f"g{self.gids}"
            self._execute(f"PREPARE TRANSACTION '{gid}'")
            self.prepared = (txn, gid, self.work)
            self.work = None
            if txn.defer:
                # A commit after the PREPARE, so the log's durable end passes it.
                self._begin()
                self._step("event", 0, 0, Values(name=f"after {gid}"))
                self._execute("COMMIT")
                self._commit()
            else:
                self.settle()
        else:
            self._execute("COMMIT")
            self._commit()

    def settle(self) -> None:
        """Decide the prepared transaction. A deferred one is decided by the next transaction
        (or pass): meanwhile only the keyless table changes, as it holds its rows' locks."""
        if self.prepared is None:
            return
        txn, gid, work = self.prepared
        self.prepared = None
        if txn.kind == "prepare and commit":
            self._execute(f"COMMIT PREPARED '{gid}'")
            self.work = work
            self._commit()
        else:
            self._execute(f"ROLLBACK PREPARED '{gid}'")

    def _execute(self, sql: str, params: Any = None) -> None:
        self.conn.execute(sql, params)

    def _begin(self) -> None:
        self._execute("BEGIN")
        self.work = self._copy_of(self.items, self.notes, [])

    @staticmethod
    def _copy_of(
        items: dict[int, Row], notes: dict[int, Row], pending: list[tuple[Any, ...]]
    ) -> tuple[dict[int, Row], dict[int, Row], list[tuple[Any, ...]]]:
        return (
            {k: dict(v) for k, v in items.items()},
            {k: dict(v) for k, v in notes.items()},
            list(pending),
        )

    def _copy(self) -> tuple[dict[int, Row], dict[int, Row], list[tuple[Any, ...]]]:
        assert self.work is not None
        return self._copy_of(*self.work)

    def _commit(self) -> None:
        assert self.work is not None
        self.items, self.notes, pending = self.work
        self.work = None
        if pending:
            self.changes += [
                Change(table, self.committed, seq, *rest)
                for seq, (table, *rest) in enumerate(pending)
            ]
            self.committed += 1

    def _bulk(self) -> None:
        assert self.work is not None
        self._execute(
            "INSERT INTO events SELECT 'bulk', %s || g FROM generate_series(1, %s) g",
            (BULK_PAYLOAD, BULK_ROWS),
        )
        for g in range(1, BULK_ROWS + 1):
            self.work[2].append(
                ("public.events", "insert", {"kind": "bulk", "payload": f"{BULK_PAYLOAD}{g}"}, None)
            )

    def _step(self, action: str, key: int, other: int, v: Values) -> None:
        assert self.work is not None
        items, notes, pending = self.work
        table = "public.notes" if "note" in action else "public.items"
        if action == "event":
            self._execute("INSERT INTO events VALUES ('event', %s)", (v.name,))
            pending.append(("public.events", "insert", {"kind": "event", "payload": v.name}, None))
        elif action.startswith("truncate"):
            self._execute(f"TRUNCATE {table}")
            (notes if "notes" in action else items).clear()
            pending.append((table, "truncate", None, None))
        elif table == "public.notes":
            self._note(action, key, v, notes, pending)
        elif action == "insert" and key not in items:
            row = {"id": key, "name": v.name, "body": v.body(), "qty": v.qty, "price": v.price,
                   "at": v.at, "flag": v.flag, "data": v.data}  # fmt: skip
            self._execute(
                "INSERT INTO items VALUES (%(id)s, %(name)s, %(body)s, %(qty)s, %(price)s, "
                "%(at)s, %(flag)s, %(data)s)",
                row,
            )
            items[key] = row
            pending.append((table, "insert", dict(row), None))
        elif key not in items:
            return  # updates and deletes of a missing row change nothing
        elif action == "delete":
            self._execute("DELETE FROM items WHERE id = %s", (key,))
            del items[key]
            pending.append((table, "delete", None, {"id": key}))
        elif action == "move":
            if other in items:
                return
            self._execute("UPDATE items SET id = %s WHERE id = %s", (other, key))
            row = items.pop(key)
            row["id"] = other
            items[other] = row
            self._updated(row, {"id": key}, toasted=True)
        else:
            row = items[key]
            row.update(name=v.name, qty=v.qty, price=v.price, at=v.at, flag=v.flag, data=v.data)
            sets = "name = %(name)s, qty = %(qty)s, price = %(price)s, at = %(at)s, "
            sets += "flag = %(flag)s, data = %(data)s"
            if action == "update body":
                row["body"] = v.body()
                sets += ", body = %(body)s"
            self._execute(f"UPDATE items SET {sets} WHERE id = %(id)s", row)
            self._updated(row, None, toasted=action != "update body")

    def _updated(self, row: Row, old: Row | None, *, toasted: bool) -> None:
        """An UPDATE's change: a body stored out of line that it left is not sent."""
        assert self.work is not None
        unchanged = ("body",) if toasted and len(row["body"]) == LONG_BODY else ()
        new = {k: (None if k in unchanged else v) for k, v in row.items()}
        self.work[2].append(("public.items", "update", new, old, unchanged))

    def _note(
        self, action: str, key: int, v: Values, notes: dict[int, Row], pending: list[Any]
    ) -> None:
        old = notes.get(key)
        if action == "delete note":
            if old is not None:
                self._execute("DELETE FROM notes WHERE id = %s", (key,))
                del notes[key]
                pending.append(("public.notes", "delete", None, old))
            return
        row = {"id": key, "note": v.name, "score": v.score}
        if old is None:
            self._execute("INSERT INTO notes VALUES (%(id)s, %(note)s, %(score)s)", row)
            pending.append(("public.notes", "insert", row, None))
        else:
            self._execute(
                "UPDATE notes SET note = %(note)s, score = %(score)s WHERE id = %(id)s", row
            )
            pending.append(("public.notes", "update", row, dict(old)))
        notes[key] = dict(row)


# --- running it and reading the lake ----------------------------------------------------------


def prepare_source(database: Database) -> None:
    with database.connect() as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text, body text, qty bigint, "
            "price numeric(12, 2), at timestamptz, flag bool, data bytea)"
        )
        conn.execute("ALTER TABLE items ALTER body SET STORAGE EXTERNAL")
        conn.execute("CREATE TABLE notes (id int, note text, score float8)")
        conn.execute("ALTER TABLE notes REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE events (kind text, payload text)")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        conn.execute(f"ALTER DATABASE \"{database.name}\" SET logical_decoding_work_mem = '64kB'")
        # Two-phase from the slot's creation, as CREATE_REPLICATION_SLOT ... TWO_PHASE makes it.
        conn.execute(
            f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput', false, true)"
        )


def delta_changes(lake: Path) -> list[Change]:
    """The Delta changelogs' rows as ``Change``s: transactions numbered in commit order, changes
    in each from 0 in log order."""
    rows: list[tuple[str, Row]] = []
    for name in COLUMNS:
        path = lake_path(lake, name, SinkKind.CHANGELOG)
        if Path(path).exists():
            rows += [(name, row) for row in read_table(path).to_pylist()]
    commits = {lsn: n for n, lsn in enumerate(sorted({row["_commit_lsn"] for _, row in rows}))}
    changes = []
    for name, row in rows:
        assert not row.get("_text"), f"a value the typed column cannot hold: {row}"
        op = row["_op"]
        new = {c: row[c] for c in COLUMNS[name]} if op in ("insert", "update") else None
        old = row.get("_old")
        if old is not None:
            old = {c: v for c, v in old.items() if v is not None}
        unchanged = tuple(sorted(row["_unchanged"]))
        changes.append(
            Change(name, commits[row["_commit_lsn"]], row["_seq"], op, new, old, unchanged)
        )
    # ``_seq`` counts a transaction's events (Relation messages too): keep its order only.
    changes.sort(key=lambda c: (c.transaction, c.seq))
    position = {c.transaction: 0 for c in changes}
    renumbered = []
    for change in changes:
        renumbered.append(replace(change, seq=position[change.transaction]))
        position[change.transaction] += 1
    return renumbered


def expected_changes(model: Model) -> list[Change]:
    """The model's changes as the changelog holds them: an old row lists its non-null values."""
    return [
        Change(
            c.table,
            c.transaction,
            c.seq,
            c.op,
            c.new,
            None if c.old is None else {k: v for k, v in c.old.items() if v is not None},
            c.unchanged,
        )
        for c in model.changes
    ]


def assert_same_changes(got: list[Change], expected: list[Change]) -> None:
    for n, (g, e) in enumerate(zip(got, expected, strict=False)):
        assert g == e, f"change {n} of {len(expected)} differs:\n got      {g}\n expected {e}"
    assert len(got) == len(expected), f"{len(got)} changes in the lake, {len(expected)} made"


def source_rows(conn: psycopg.Connection[Any], name: str) -> list[Row]:
    cursor = conn.execute(f"SELECT {', '.join(COLUMNS[name])} FROM {name} ORDER BY id")
    return [dict(zip(COLUMNS[name], row, strict=True)) for row in cursor]


def lake_rows(lake: Path, name: str, kind: SinkKind) -> list[Row]:
    path = lake_path(lake, name, kind)
    if not Path(path).exists():  # the table never changed
        return []
    table = read_table(path)
    if kind is SinkKind.HISTORY:
        table = table.filter(pc.equal(table.column("_is_current"), True))
    return sorted(table.select(list(COLUMNS[name])).to_pylist(), key=lambda r: r["id"])


def run_pipeline(database: Database, root: Path, binary: bool, spark: Any) -> None:
    # The wire settings as users write them: two-phase decoding, and binary in one run.
    config = root / "pipeline.toml"
    config.write_text(f"[source]\nbinary = {str(binary).lower()}\ntwo_phase = true\n")
    settings = pipeline.load(
        config,
        {
            "conninfo": database.conninfo(),
            "slot": SLOT,
            "publications": (PUBLICATION,),
            "create_slot": False,
            "snapshot": "never",
            "changelog": str(root / "changelog"),
            "lake": str(root / "lake"),
            "checkpoint": str(root / "checkpoint"),
            "master": "local[2]",
            "trigger_interval": 0.5,
            "max_changes_per_batch": 200,
        },
    )
    assert settings.receiver().two_phase and settings.binary == binary
    pipeline.run(settings, once=True, spark=spark)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.filterwarnings("ignore:public.events has no usable replica identity")
@settings(
    max_examples=examples(1),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs())
@example(program=EDGE_PROGRAM)
def test_random_workloads_through_the_receiver_land_change_for_change(
    cluster: LocalCluster, spark: Any, binary: bool, program: tuple[list[Transaction], int]
) -> None:
    transactions_, first_pass = program
    with fresh_database(cluster) as database, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare_source(database)
        with database.connect() as conn:
            model = Model(conn)
            for txn in transactions_[:first_pass]:
                model.run(txn)
            run_pipeline(database, root, binary, spark)  # a prepared one may be open
            for txn in transactions_[first_pass:]:
                model.run(txn)
            model.settle()
            run_pipeline(database, root, binary, spark)

            lake = root / "lake"
            assert_same_changes(delta_changes(lake), expected_changes(model))
            for name in ("public.items", "public.notes"):
                source = source_rows(conn, name)
                assert source == sorted(
                    (model.items if name == "public.items" else model.notes).values(),
                    key=lambda r: r["id"],
                ), name
                for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
                    assert lake_rows(lake, name, kind) == source, (name, kind)
            assert slot_streamed(conn, SLOT), "no transaction was streamed to the pipeline"
