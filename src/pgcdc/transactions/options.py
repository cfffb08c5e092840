"""Client-side decoding options, the same for every output plugin, under openGauss's names.

pgcdc applies these itself, after decoding, so pgoutput, test_decoding and openGauss streams
behave alike. Defaults never drop information: openGauss defaults include-timestamp to 0, but
a change log without commit times cannot feed history tables, so pgcdc keeps them unless told.
Memory limits are in MB (openGauss gives max-reorderbuffer-in-memory in GB; pgcdc uses MB for
both so the two limits compare directly); fractions are allowed, 0 turns a limit off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from pgcdc.errors import InvalidOption
from pgcdc.transactions.filters import TableFilter

MB = 1024 * 1024

OriginFilter = Literal["any", "none"]

_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


@dataclass(frozen=True, slots=True)
class AssemblyOptions:
    """How the TransactionAssembler filters, bounds and times its output."""

    include_xids: bool = True
    include_timestamp: bool = True
    skip_empty_xacts: bool = False
    # openGauss white-table-list ('public.t1,*.t3,app.*'); None keeps every table.
    white_table_list: str | None = None
    # 'none' drops transactions replayed from elsewhere (they carry an Origin); 'any' keeps all.
    origin_filter: OriginFilter = "any"
    # Two-phase: emit at PREPARE (outcome PREPARE, then a COMMIT/ROLLBACK_PREPARED marker)
    # instead of holding the transaction until COMMIT PREPARED.
    emit_at_prepare: bool = False
    max_txn_in_memory: float = 0.0
    max_reorderbuffer_in_memory: float = 0.0
    # Root for spill files; None means <system temp dir>/pgcdc-spill.
    spill_dir: str | None = None
    enable_heartbeat: bool = False
    heartbeat_interval: float = 10.0
    sending_batch: bool = False
    batch_max_bytes: int = MB
    batch_max_seconds: float = 1.0
    table_filter: TableFilter | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "include_xids",
            "include_timestamp",
            "skip_empty_xacts",
            "emit_at_prepare",
            "enable_heartbeat",
            "sending_batch",
        ):
            value = getattr(self, name)
            if type(value) is not bool:
                raise InvalidOption(
                    f"{name} must be True or False, not {value!r}; to read openGauss-style "
                    "text values ('0', '1', 'on'...) use AssemblyOptions.from_plugin_options"
                )
        if self.origin_filter not in ("any", "none"):
            raise InvalidOption(
                f"origin_filter must be 'any' (keep every transaction) or 'none' (drop "
                f"transactions that carry a replication origin), not {self.origin_filter!r}"
            )
        for name in ("max_txn_in_memory", "max_reorderbuffer_in_memory"):
            _check_number(name, getattr(self, name), allow_zero=True, unit="MB")
        _check_number("heartbeat_interval", self.heartbeat_interval, allow_zero=False, unit="s")
        _check_number("batch_max_seconds", self.batch_max_seconds, allow_zero=False, unit="s")
        if type(self.batch_max_bytes) is not int or self.batch_max_bytes <= 0:
            raise InvalidOption(
                f"batch_max_bytes must be a positive whole number of bytes, not "
                f"{self.batch_max_bytes!r}"
            )
        if self.spill_dir is not None and (
            not isinstance(self.spill_dir, str) or not self.spill_dir
        ):
            raise InvalidOption(
                f"spill_dir must be a directory path or None (the system temp dir), not "
                f"{self.spill_dir!r}"
            )
        table_filter = None
        if self.white_table_list is not None:
            if not isinstance(self.white_table_list, str):
                raise InvalidOption(
                    f"white_table_list must be a string like 'public.t1,*.t3', not "
                    f"{self.white_table_list!r}"
                )
            table_filter = TableFilter.parse(self.white_table_list)
        object.__setattr__(self, "table_filter", table_filter)

    @property
    def max_txn_bytes(self) -> int:
        """The per-transaction memory limit in bytes; 0 when off."""
        return int(self.max_txn_in_memory * MB)

    @property
    def max_total_bytes(self) -> int:
        """The limit on all buffered transactions together in bytes; 0 when off."""
        return int(self.max_reorderbuffer_in_memory * MB)

    @classmethod
    def from_plugin_options(cls, options: Mapping[str, str]) -> AssemblyOptions:
        """Build options from openGauss-style names and text values
        (``{"include-xids": "0", "white-table-list": "public.*"}``)."""
        known = {f.name.replace("_", "-"): f for f in fields(cls) if f.init}
        values: dict[str, Any] = {}
        for key, text in options.items():
            spec = known.get(key)
            if spec is None:
                raise InvalidOption(
                    f"unknown decoding option {key!r}; known options: {', '.join(sorted(known))}"
                )
            default = spec.default
            if isinstance(default, bool):
                values[spec.name] = _parse_bool(key, text)
            elif isinstance(default, int):
                values[spec.name] = _parse_number(key, text, int)
            elif isinstance(default, float):
                values[spec.name] = _parse_number(key, text, float)
            else:
                values[spec.name] = text
        return cls(**values)


def _check_number(name: str, value: object, *, allow_zero: bool, unit: str) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        bound = "zero (off) or a positive number" if allow_zero else "a positive number"
        raise InvalidOption(f"{name} must be {bound} of {unit}, not {value!r}")


def _parse_bool(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidOption(
        f"decoding option {key!r} takes 0 or 1 (or on/off, true/false), not {text!r}"
    )


def _parse_number(key: str, text: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidOption(f"decoding option {key!r} takes {what}, not {text!r}") from None
