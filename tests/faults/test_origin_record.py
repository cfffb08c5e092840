"""The change log's slot record (pgcdc-slot.json) keeps IDENTIFY_SYSTEM's system identifier (a
uint64, exact) and timeline, and reads records written before they were kept."""

from __future__ import annotations

import json

from pgcdc.lsn import LSN
from pgcdc.pipeline.origin import SlotOrigin


def test_the_record_keeps_system_identifier_and_timeline() -> None:
    origin = SlotOrigin(
        "s", "db", LSN(1), LSN(2), system_id=(1 << 64) - 1, timeline=3, on_standby=True
    )
    assert SlotOrigin.from_json(origin.to_json()) == origin
    old = json.dumps(
        {"slot": "s", "database": "db", "created_lsn": "0/1", "confirmed_bound": "0/2"}
    )
    assert SlotOrigin.from_json(old) == SlotOrigin("s", "db", LSN(1), LSN(2))
