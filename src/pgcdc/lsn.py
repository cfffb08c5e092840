"""Log sequence numbers: positions in PostgreSQL's write-ahead log."""

from __future__ import annotations

from typing import Any

_MAX = (1 << 64) - 1


class LSN(int):
    """A 64-bit WAL position, printed as PostgreSQL prints it ("16/B374D848").

    An ``int`` subclass, so LSNs order, hash and serialise like integers. Adding bytes gives an
    LSN; subtracting two LSNs gives the distance in bytes.
    """

    __slots__ = ()

    def __new__(cls, value: int | str = 0) -> LSN:
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> LSN:
        """Parse "X/Y" (two hexadecimal halves), as SQL and replication commands print it."""
        high, sep, low = text.strip().partition("/")
        if not sep or not high or not low or len(high) > 8 or len(low) > 8:
            raise ValueError(f"invalid LSN {text!r}: expected two hex numbers as 'X/Y'")
        try:
            return cls((int(high, 16) << 32) | int(low, 16))
        except ValueError:
            raise ValueError(f"invalid LSN {text!r}: expected two hex numbers as 'X/Y'") from None

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"

    def __add__(self, other: Any) -> LSN:
        if isinstance(other, LSN) or not isinstance(other, int):
            return NotImplemented
        return LSN(int(self) + other)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        """LSN - LSN is a byte distance (int); LSN - int is an LSN."""
        if isinstance(other, LSN):
            return int(self) - int(other)
        if isinstance(other, int):
            return LSN(int(self) - other)
        return NotImplemented


INVALID_LSN = LSN(0)
