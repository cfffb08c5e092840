"""What the oracle workload covers: column specs (a PostgreSQL type and the edge values to write
into it, as SQL literals) and table specs (names, keys, replica identity, which columns).

Coverage is data, so it can be narrowed or widened without touching the harness: every list
here is a plain module-level value (``COLUMNS``, ``TOAST_COLUMNS``, ``TABLES``, ``USER_TYPES``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

# User-defined types the column specs use; created on the publisher and on the subscriber.
USER_TYPES: list[str] = [
    "CREATE TYPE mood AS ENUM ('happy', 'sad', 'with space', 'ünï \"q\"')",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
    "CREATE DOMAIN money2 AS numeric(10, 2)",
    "CREATE DOMAIN tagtext AS text",
    "CREATE TYPE pair AS (a int4, b text, c float8)",
    "CREATE TYPE floatrange AS RANGE (subtype = float8)",
    "CREATE TYPE tagged AS (m mood, p pair, r floatrange, f float4)",
]


@dataclass(frozen=True)
class ColumnSpec:
    """A column of type ``sql_type`` whose values are drawn from ``values`` (SQL literals).

    ``key``: usable in a primary key (has a btree opclass). ``full``: usable in a REPLICA
    IDENTITY FULL table (the subscriber finds the old row with the type's equality operator,
    so json, point, ... cannot be there). ``min_major``: the oldest server version that knows
    the values.
    """

    name: str
    sql_type: str
    values: tuple[str, ...]
    key: bool = True
    full: bool = True
    min_major: int = 0


def c(name: str, sql_type: str, *values: str, **flags: bool | int) -> ColumnSpec:
    return ColumnSpec(name, sql_type, values, **flags)  # type: ignore[arg-type]


COLUMNS: list[ColumnSpec] = [
    c("b", "bool", "true", "false"),
    c("i2", "int2", "-32768", "32767", "0"),
    c("i4", "int4", "-2147483648", "2147483647", "7"),
    c("i8", "int8", "-9223372036854775808", "9223372036854775807", "42"),
    c(
        "f4",
        "float4",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "'-0'",
        "'1.17549435e-38'",
        "'3.4028235e+38'",
        "'0.1'",
        "'1e-45'",
    ),
    c(
        "f8",
        "float8",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "'-0'",
        "'5e-324'",
        "'1.7976931348623157e+308'",
        "'0.1'",
        "'1e+20'",
        "'123456.789'",
    ),
    c(
        "num",
        "numeric",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "'1.10'",
        "'-0.000000000000000000001'",
        "'123456789012345678901234567890123456789012345678901234567890.123456789'",
        "'1e300'",
        "'0'",
    ),
    c("n12", "numeric(12, 2)", "'1234567890.12'", "'-0.01'", "'0'", "'NaN'"),
    c("n40", "numeric(40, 10)", "'123456789012345678901234567890.0123456789'", "'-1'"),
    c("mon", "money", "'-92233720368547758.08'", "'92233720368547758.07'", "'1234.56'", "'0'"),
    c(
        "txt",
        "text",
        "''",
        "'a''b'",
        "'ü漢字 ☃'",
        "E'tab\\there'",
        "E'line\\nbreak\\r'",
        "'back\\slash'",
        "'NULL'",
        "'\"{q}\"'",
    ),
    c("vc", "varchar(10)", "'abc'", "''", "'ü'"),
    c("bpc", "char(5)", "'ab'", "'abcde'", "' '"),
    c("nm", "name", "'some name'", "'Ü'"),
    c("ch", '"char"', "'a'", "E'\\\\377'", "''"),
    c("byt", "bytea", "'\\x'", "'\\x00ff'", "'\\x5c00275c'", "'\\xdeadbeef'"),
    c(
        "d",
        "date",
        "'4713-01-01 BC'",
        "'5874897-12-31'",
        "'infinity'",
        "'-infinity'",
        "'2000-02-29'",
        "'0001-01-01 BC'",
        "'10000-01-01'",
        "'1970-01-01'",
    ),
    c("t", "time", "'00:00'", "'24:00:00'", "'23:59:59.999999'", "'12:00:00.5'"),
    c(
        "ttz",
        "timetz",
        "'00:00+14'",
        "'24:00:00-15:59'",
        "'12:34:56.789+05:30'",
        "'01:02:03-00:00:01'",
    ),
    c(
        "ts",
        "timestamp",
        "'4713-01-01 00:00 BC'",
        "'294276-12-31 23:59:59.999999'",
        "'infinity'",
        "'-infinity'",
        "'2000-01-01 00:00:00.000001'",
        "'1969-12-31 23:59:59.5'",
        "'0044-03-15 12:00 BC'",
        "'10000-06-01 00:00'",
    ),
    c(
        "tstz",
        "timestamptz",
        "'4713-01-01 00:00+00 BC'",
        "'294276-12-31 23:59:59.999999+00'",
        "'infinity'",
        "'-infinity'",
        "'2024-03-10 02:30:00 America/New_York'",
        "'1900-01-01 00:00:00+00'",
        "'1883-11-18 12:00 America/St_Johns'",
        "'2000-01-01 00:00+14'",
    ),
    c(
        "iv",
        "interval",
        "'1 mon 2 days 03:04:05.678901'",
        "'-178000000 years'",
        "'178000000 years'",
        "'-1 day +01:00'",
        "'2562047788 hours 54.775807 seconds'",
        "'0'",
        "'-1 mon -0.000001 seconds'",
    ),
    c("iv_inf", "interval", "'infinity'", "'-infinity'", "'1 day'", min_major=17),
    c(
        "u",
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
        "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
        "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
    ),
    c(
        "js",
        "json",
        '\'{"b":1, "a":[1,2.50,1e400], "a":null}\'',
        "'\"ü\\u0000x\"'",
        "'  [ ]  '",
        "'null'",
        key=False,
        full=False,
    ),
    c(
        "jb",
        "jsonb",
        '\'{"b":1, "a":[1,2.50,1e400]}\'',
        "'\"ü\"'",
        "'[]'",
        "'null'",
        "'{\"k\": 123456789012345678901234567890.5}'",
    ),
    c("ip", "inet", "'192.168.0.1/24'", "'::1'", "'10.0.0.1'", "'2001:db8::1/64'"),
    c("cid", "cidr", "'10.0.0.0/8'", "'2001:db8::/32'"),
    c("mac", "macaddr", "'08:00:2B:01:02:03'", "'ff:ff:ff:ff:ff:ff'"),
    c("mac8", "macaddr8", "'08:00:2b:01:02:03:04:05'"),
    c("bt", "bit(4)", "B'1010'", "B'0000'"),
    c("vb", "varbit", "B''", "B'1'", "B'10101010101'"),
    c("lsn", "pg_lsn", "'0/0'", "'FFFFFFFF/FFFFFFFF'", "'16/B374D848'"),
    c("o", "oid", "'4294967295'", "'0'"),
    c(
        "ia",
        "int4[]",
        "'{{1,NULL},{3,4}}'",
        "'[0:1]={5,6}'",
        "'{}'",
        "'{1,2,NULL}'",
        "'{{{1}}}'",
        key=False,
    ),
    c(
        "ta",
        "text[]",
        '\'{"a b",NULL,"\\"q\\"","NULL"}\'',
        "'{\"\"}'",
        "'{x,y}'",
        key=False,
    ),
    c("fa", "float8[]", "'{NaN,Infinity,-0,1.5}'", "'{{1,2},{3,NULL}}'", key=False),
    c("da", "date[]", "'{infinity,2000-01-01,NULL}'", "'{4713-01-01 BC}'", key=False),
    c("tsa", "timestamptz[]", "'{\"2000-01-01 00:00+05\",-infinity}'", key=False),
    c("na", "numeric[]", "'{NaN,1.50,-1e-20}'", key=False),
    c("en", "mood", "'happy'", "'with space'", "'ünï \"q\"'"),
    c("ena", "mood[]", "'{sad,\"with space\"}'", key=False),
    c("dom", "posint", "1", "2147483647"),
    c("domn", "money2", "'12345678.90'", "'-0.5'"),
    c("domt", "tagtext", "'tag'", "'ü'"),
    c(
        "comp",
        "pair",
        "ROW(1, 'a b', 'NaN')::pair",
        "ROW(NULL, NULL, NULL)::pair",
        "ROW(2, '\"q\",', '-Infinity')::pair",
    ),
    c(
        "tag",
        "tagged",
        "ROW('with space', ROW(1, '', 1e300)::pair, '[1.5,2e20)', 1.1)::tagged",
        "ROW(NULL, NULL, 'empty', '-0')::tagged",
        key=False,
    ),
    c("fr", "floatrange", "'[1.5,2.5)'", "'(-1e300,0.1]'", "'(,Infinity]'"),
    c("r", "int4range", "'[1,5)'", "'empty'", "'(,3]'"),
    c("tr", "tstzrange", "'[2020-01-01 00:00+00,infinity)'", "'(,)'"),
    c("nr", "numrange", "'[1.5,2.25]'", "'(-1,)'"),
    c("mr", "int4multirange", "'{[1,2),[5,7)}'", "'{}'"),
    c("pt", "point", "'(1.5,-0)'", "'(NaN,Infinity)'", "'(1e22,1.23e22)'", key=False, full=False),
    c("ln", "line", "'{1,-1,0}'", "'{0.5,2,-3.25}'", key=False, full=False),
    c("ls", "lseg", "'[(0,0),(1,1e-5)]'", key=False, full=False),
    c("bx", "box", "'((3,4),(-1,-2))'", key=False, full=False),
    c("pa", "path", "'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'", key=False, full=False),
    c("pg", "polygon", "'((0,0),(1,1),(2,0.5))'", key=False, full=False),
    c("ci", "circle", "'<(1,2),3.5>'", key=False, full=False),
]


@dataclass(frozen=True)
class ToastSpec:
    """A column whose values are big enough to be TOASTed out of line (STORAGE EXTERNAL),
    so an UPDATE of other columns sends it as unchanged TOAST. ``kind`` picks the generator
    in ``workload.toast_literal``."""

    name: str
    sql_type: str
    kind: str
    full: bool = True


TOAST_COLUMNS: list[ToastSpec] = [
    ToastSpec("big_text", "text", "text"),
    ToastSpec("big_bytea", "bytea", "bytea"),
    ToastSpec("big_jsonb", "jsonb", "jsonb"),
    ToastSpec("big_num", "numeric", "numeric"),
    # Two dimensions: has only a text form in the lake (_text), TOASTed.
    ToastSpec("big_grid", "int4[]", "grid", full=False),
    ToastSpec("big_dates", "date[]", "dates", full=False),
]


@dataclass(frozen=True)
class TableSpec:
    """A table of the workload. ``kind``: "wide" (primary key ``id``, every column), "keys"
    (primary key over the key-able columns, so rows differing in one key value only are
    distinct rows) or "full" (REPLICA IDENTITY FULL, no key, duplicate rows)."""

    schema: str
    name: str
    kind: str
    columns: list[str] = field(default_factory=list)  # empty: every spec that fits the kind

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"


KEY_COLUMNS = ["f8", "num", "tstz", "d", "txt", "byt", "u", "iv", "ts", "f4"]

# Names with spaces, quotes, mixed case and non-ASCII in schema and table.
TABLES: list[TableSpec] = [
    TableSpec('Sch "q" ü', "Wide Tbl", "wide"),
    TableSpec("MixedCase", "Keys ë", "keys", KEY_COLUMNS),
    TableSpec("public", 'full "dup"', "full"),
]
# The same tables with plain names (PGCDC_ORACLE_NAMES=plain): separates the values' defects
# from the names' while a lake path problem stops the whole pipeline.
PLAIN_TABLES: list[TableSpec] = [
    TableSpec("public", "wide", "wide"),
    TableSpec("public", "keys", "keys", KEY_COLUMNS),
    TableSpec("public", "fulldup", "full"),
]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _skipped() -> tuple[set[str], list[str]]:
    """Columns (``PGCDC_ORACLE_SKIP_COLUMNS=f4,full:ia``: everywhere, or in the tables of one
    kind) and values (``PGCDC_ORACLE_SKIP_VALUES``:
    literals containing any of these comma-separated substrings) to leave out, e.g. to see
    past a value that stops the whole pipeline."""
    columns = {n for n in os.environ.get("PGCDC_ORACLE_SKIP_COLUMNS", "").split(",") if n}
    values = [v for v in os.environ.get("PGCDC_ORACLE_SKIP_VALUES", "").split(",") if v]
    return columns, values


def active(spec: ColumnSpec) -> ColumnSpec:
    """``spec`` without the skipped values."""
    _, skipped = _skipped()
    return replace(spec, values=tuple(v for v in spec.values if not any(s in v for s in skipped)))


def columns_for(table: TableSpec, major: int) -> list[ColumnSpec]:
    """The value columns of ``table`` on a server of version ``major``."""
    wanted = set(table.columns)
    skipped_columns, _ = _skipped()
    chosen = []
    for spec in map(active, COLUMNS):
        if not spec.values or {spec.name, f"{table.kind}:{spec.name}"} & skipped_columns:
            continue
        if spec.min_major > major:
            continue
        if wanted and spec.name not in wanted:
            continue
        if table.kind == "keys" and not spec.key:
            continue
        if table.kind == "full" and not spec.full:
            continue
        chosen.append(spec)
    return chosen


def toast_for(table: TableSpec) -> list[ToastSpec]:
    skipped, _ = _skipped()
    chosen = [t for t in TOAST_COLUMNS if not {t.name, f"{table.kind}:{t.name}"} & skipped]
    if table.kind == "keys":
        return chosen[:1]
    if table.kind == "full":
        return [t for t in chosen if t.full]
    return chosen


def tables() -> list[TableSpec]:
    """The workload's tables: ``TABLES``, or ``PLAIN_TABLES`` with ``PGCDC_ORACLE_NAMES=plain``;
    ``PGCDC_ORACLE_KINDS=wide,keys`` keeps only those kinds."""
    chosen = PLAIN_TABLES if os.environ.get("PGCDC_ORACLE_NAMES") == "plain" else TABLES
    kinds = {k for k in os.environ.get("PGCDC_ORACLE_KINDS", "").split(",") if k}
    return [t for t in chosen if not kinds or t.kind in kinds]
