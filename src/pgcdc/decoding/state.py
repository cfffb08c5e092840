"""What a decoder knows between messages: relation and type definitions, and whether it is
inside a streamed-transaction block.

pgoutput sends each table's definition once (and again when it changes), then refers to it by
OID, so decoding a message needs everything decoded before it. Keeping that knowledge in one
explicit, picklable value lets a receiver checkpoint it next to an LSN and lets a Spark executor
continue decoding from that point, without replaying the stream from the slot's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import DecodeError
from pgcdc.events import Column, ReplicaIdentity, Table

STATE_FORMAT = 1
"""Version of the ``to_dict`` form; ``from_dict`` refuses forms it does not know."""


@dataclass(slots=True)
class DecoderState:
    """Relation cache (OID -> Table), type cache (OID -> TypeInfo) and the open stream block.

    Tables and TypeInfos are immutable, so ``copy()`` only copies two dicts: cheap enough to
    snapshot at every checkpoint.
    """

    relations: dict[int, Table] = field(default_factory=dict)
    types: dict[int, TypeInfo] = field(default_factory=dict)
    # The xid of the streamed transaction between Stream Start and Stream Stop, else None.
    # Inside that block pgoutput prefixes Relation, Type, changes and Messages with the xid.
    stream_xid: int | None = None

    def copy(self) -> DecoderState:
        return DecoderState(dict(self.relations), dict(self.types), self.stream_xid)

    def table(self, oid: int) -> Table | None:
        return self.relations.get(oid)

    def add_type(self, info: TypeInfo) -> None:
        """Record (or enrich, e.g. with a base type read from pg_type) a type's description."""
        self.types[info.oid] = info

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form (only dicts, lists, str, int, bool and None)."""
        return {
            "format": STATE_FORMAT,
            "relations": [table_to_dict(t) for t in self.relations.values()],
            "types": [type_to_dict(t) for t in self.types.values()],
            "stream_xid": self.stream_xid,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecoderState:
        """Rebuild a state saved by ``to_dict``; a damaged form is a ``DecodeError``."""
        try:
            if data["format"] != STATE_FORMAT:
                raise DecodeError(
                    f"decoder state format {data['format']!r} is not supported (expected "
                    f"{STATE_FORMAT}); it was written by another pgcdc version: restart decoding "
                    "from the slot's start instead"
                )
            relations = [table_from_dict(t) for t in data["relations"]]
            types = [type_from_dict(t) for t in data["types"]]
            stream_xid = data["stream_xid"]
            if stream_xid is not None:
                stream_xid = _int(stream_xid)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DecodeError):
                raise
            raise DecodeError(
                f"saved decoder state is damaged ({type(exc).__name__}: {exc}); restore it from "
                "an intact copy or restart decoding from the slot's start"
            ) from exc
        return cls({t.oid: t for t in relations}, {t.oid: t for t in types}, stream_xid)


# --- JSON-safe forms of definitions, shared with the change log --------------------------------


def table_to_dict(table: Table) -> dict[str, Any]:
    return {
        "oid": table.oid,
        "namespace": table.namespace,
        "name": table.name,
        "replica_identity": table.replica_identity.value,
        "columns": [
            {
                "name": c.name,
                "type_oid": c.type_oid,
                "type_modifier": c.type_modifier,
                "is_key": c.is_key,
                "type_name": c.type_name,
            }
            # Only when set, so definitions without them read and compare as before.
            | ({"missing": c.missing} if c.missing is not None else {})
            | ({"default_unseen": True} if c.default_unseen else {})
            for c in table.columns
        ],
    }


def table_from_dict(data: Mapping[str, Any]) -> Table:
    """Inverse of ``table_to_dict``; wrong keys or value types raise KeyError/TypeError."""
    columns = tuple(
        Column(
            name=_str(c["name"]),
            type_oid=_int(c["type_oid"]),
            type_modifier=_int(c["type_modifier"]),
            is_key=_bool(c["is_key"]),
            type_name=None if c["type_name"] is None else _str(c["type_name"]),
            missing=None if c.get("missing") is None else _str(c["missing"]),
            default_unseen=_bool(c.get("default_unseen", False)),
        )
        for c in data["columns"]
    )
    return Table(
        namespace=_str(data["namespace"]),
        name=_str(data["name"]),
        columns=columns,
        oid=_int(data["oid"]),
        replica_identity=ReplicaIdentity(data["replica_identity"]),
    )


def type_to_dict(info: TypeInfo) -> dict[str, Any]:
    return {
        "oid": info.oid,
        "namespace": info.namespace,
        "name": info.name,
        "kind": info.kind,
        "base_oid": info.base_oid,
        "element_oid": info.element_oid,
        "base_modifier": info.base_modifier,
    }


def type_from_dict(data: Mapping[str, Any]) -> TypeInfo:
    """Inverse of ``type_to_dict``; wrong keys or value types raise KeyError/TypeError."""
    return TypeInfo(
        oid=_int(data["oid"]),
        namespace=_str(data["namespace"]),
        name=_str(data["name"]),
        kind=_str(data["kind"]),
        base_oid=_int(data["base_oid"]),
        element_oid=_int(data["element_oid"]),
        # Absent from definitions written before it was recorded.
        base_modifier=_int(data.get("base_modifier", -1)),
    )


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value
