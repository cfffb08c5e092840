"""openGauss's white-table-list: which tables' changes a consumer wants.

The grammar is openGauss's: ``schema.table`` entries separated by commas, no whitespace
anywhere, and ``*`` standing for any schema or any table name (``public.t1,*.t3,app.*``).
``*`` matches a whole name only: openGauss has no partial wildcards, and accepting ``t*`` with a
meaning openGauss does not give it would silently select other tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgcdc.errors import InvalidTablePattern
from pgcdc.events import Table

ANY = "*"


@dataclass(frozen=True, slots=True)
class TablePattern:
    """One white-table-list entry; ``None`` stands for ``*`` (any name)."""

    schema: str | None
    table: str | None

    def matches(self, namespace: str, name: str) -> bool:
        return (self.schema is None or self.schema == namespace) and (
            self.table is None or self.table == name
        )

    def __str__(self) -> str:
        return f"{self.schema or ANY}.{self.table or ANY}"


def parse_table_patterns(text: str) -> tuple[TablePattern, ...]:
    """Parse a white-table-list; raise InvalidTablePattern naming the bad entry."""
    if not text:
        raise InvalidTablePattern(
            "white-table-list is empty; list tables as schema.table separated by commas "
            "(e.g. 'public.t1,*.t3,app.*'), or leave the option out to keep every table"
        )
    if any(ch.isspace() for ch in text):
        raise InvalidTablePattern(
            f"white-table-list {text!r} contains whitespace, which the openGauss grammar does "
            "not allow; write entries as schema.table joined by ',' with no spaces"
        )
    return tuple(_parse_entry(entry, text) for entry in text.split(","))


def _parse_entry(entry: str, text: str) -> TablePattern:
    parts = entry.split(".")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise InvalidTablePattern(
            f"white-table-list entry {entry!r} (in {text!r}) is not schema.table; write "
            "exactly one '.' between a schema and a table name, using '*' for any name"
        )
    for part in parts:
        if ANY in part and part != ANY:
            raise InvalidTablePattern(
                f"white-table-list entry {entry!r} uses '*' inside a name; '*' may only stand "
                "for a whole schema or table name (e.g. 'app.*' or '*.orders')"
            )
    schema, table = parts
    return TablePattern(None if schema == ANY else schema, None if table == ANY else table)


class TableFilter:
    """Matches tables against a white-table-list, remembering the answer per table name."""

    def __init__(self, patterns: tuple[TablePattern, ...]) -> None:
        self.patterns = patterns
        self._known: dict[tuple[str, str], bool] = {}

    @classmethod
    def parse(cls, text: str) -> TableFilter:
        return cls(parse_table_patterns(text))

    def matches(self, table: Table) -> bool:
        key = (table.namespace, table.name)
        known = self._known.get(key)
        if known is None:
            known = any(p.matches(table.namespace, table.name) for p in self.patterns)
            self._known[key] = known
        return known
