"""openGauss's white-table-list applied to decoded events: which tables' changes to keep.

The grammar and its parser live with the openGauss decoder
(``pgcdc.decoding.mppdb.parse_table_patterns``): ``schema.table`` entries joined by ',', no
whitespace, ``*`` for any whole schema or table name. Here it is applied client-side to every
plugin's events, with the answer remembered per table name (the same tables recur on every
change).
"""

from __future__ import annotations

from pgcdc.decoding.mppdb import TablePatterns, parse_table_patterns
from pgcdc.events import Table

__all__ = ["TableFilter", "TablePatterns", "parse_table_patterns"]


class TableFilter:
    """Matches tables against a parsed white-table-list."""

    def __init__(self, patterns: TablePatterns) -> None:
        self.patterns = patterns
        self._known: dict[tuple[str, str], bool] = {}

    @classmethod
    def parse(cls, text: str) -> TableFilter:
        """Raises InvalidTablePattern naming the bad entry."""
        return cls(parse_table_patterns(text))

    def matches(self, table: Table) -> bool:
        key = (table.namespace, table.name)
        known = self._known.get(key)
        if known is None:
            known = self.patterns.matches(table.namespace, table.name)
            self._known[key] = known
        return known
