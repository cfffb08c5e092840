"""Events made without their ``__init__``: the C builder (``pgcdc._slotted``) against its
reference (``events._python_builder``) and against the constructors, for every slotted
dataclass of the event model and the transaction model, and the row."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc import events
from pgcdc.events import EncodedRow, Insert, Update, builder, new_encoded_row
from pgcdc.lsn import LSN
from pgcdc.transactions.model import CommittedTransaction, TransactionOutcome

needs_native = pytest.mark.skipif(
    events._slotted is None, reason="built without C extensions (PGCDC_PURE_PYTHON=1)"
)

# Every slotted dataclass a builder may make: those without __post_init__ (the others refuse).
BUILDABLE = [
    cls
    for cls in [*vars(events).values(), CommittedTransaction]
    if isinstance(cls, type)
    and dataclasses.is_dataclass(cls)
    and "__slots__" in vars(cls)
    and not hasattr(cls, "__post_init__")
]
ROW_SLOTS = ("_data", "_values")


def _slots(made: object, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(name, getattr(made, name)) for name in names]


def _names(cls: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


def test_the_model_has_buildable_classes() -> None:
    """The decoders' and the assembler's classes are among those checked below."""
    assert {Insert, Update, events.Delete, events.Begin, events.Commit} <= set(BUILDABLE)
    assert CommittedTransaction in BUILDABLE


@needs_native
@pytest.mark.parametrize("cls", BUILDABLE, ids=lambda cls: cls.__name__)
@given(values=st.data())
def test_the_c_builder_is_the_reference(cls: type, values: st.DataObject) -> None:
    """Same class, same slots, any values (a builder does not check them, as the setters do
    not); and equal to what the constructor makes of the same values."""
    names = _names(cls)
    drawn = values.draw(
        st.lists(
            st.one_of(st.none(), st.integers(), st.text(), st.binary(), st.booleans()),
            min_size=len(names),
            max_size=len(names),
        )
    )
    native: object = builder(cls)(*drawn)
    reference: object = events._python_builder(cls, names)(*drawn)
    assert type(native) is type(reference) is cls
    assert _slots(native, names) == _slots(reference, names)
    assert native == cls(*drawn)


@needs_native
def test_the_c_builder_makes_rows() -> None:
    data = EncodedRow.from_values(["1", None, b"\x01"]).data
    native = new_encoded_row(data, None)
    reference = events._python_builder(EncodedRow, ROW_SLOTS)(data, None)
    assert _slots(native, ROW_SLOTS) == _slots(reference, ROW_SLOTS)
    assert native == reference == ("1", None, b"\x01")


@pytest.mark.parametrize("make", ["native", "reference"])
def test_a_builder_refuses_a_wrong_count(make: str) -> None:
    if make == "native" and events._slotted is None:
        pytest.skip("built without C extensions")
    build = builder(Insert) if make == "native" else events._python_builder(Insert, _names(Insert))
    with pytest.raises(TypeError, match="Insert takes 4"):
        build(LSN(1), None, None)
    with pytest.raises(TypeError, match="Insert takes 4"):
        build(LSN(1), None, None, None, None)


def test_a_builder_refuses_what_it_cannot_build() -> None:
    """A class that checks in __post_init__ (the builder would skip it), a name not a slot."""
    with pytest.raises(TypeError, match="__post_init__"):
        builder(LSNHolder)
    if events._slotted is not None:
        with pytest.raises(TypeError, match="not a slot"):
            builder(Insert, ("lsn", "__init__"))


@dataclasses.dataclass(frozen=True, slots=True)
class LSNHolder:
    lsn: LSN

    def __post_init__(self) -> None:
        if self.lsn < 0:
            raise ValueError("negative")


def test_the_transaction_builder_is_the_constructor() -> None:
    """The assembler's transactions, field for field (``_committed``'s keywords in place)."""
    from pgcdc.transactions.assembler import _committed

    made = _committed(
        7, LSN(16), LSN(32), None, (), origin="o", origin_lsn=LSN(8), gid=None,
        outcome=TransactionOutcome.PREPARE, size=3,
    )  # fmt: skip
    assert made == CommittedTransaction(
        xid=7, commit_lsn=LSN(16), end_lsn=LSN(32), commit_time=None, events=(), origin="o",
        origin_lsn=LSN(8), gid=None, outcome=TransactionOutcome.PREPARE, size=3,
    )  # fmt: skip
