"""What tells a redelivered version from another payload under the same version: the
fingerprint of a state's data (stores/_codec.py) — equal data in any form match, different
data never do, whatever values a store holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from shared.idempotency.messages import Entity
from shared.idempotency.stores import MemoryStore
from shared.idempotency.stores._codec import state_fingerprint

AT = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"a": 1, "b": {"x": [1, 2], "y": None}}, {"b": {"y": None, "x": [1, 2]}, "a": 1}),
        ({"n": 1, "f": 0.1, "big": 1e21}, {"n": 1.0, "f": float("0.10"), "big": 10.0**21}),
        ({"at": AT}, {"at": AT.astimezone(timezone(timedelta(hours=2)))}),  # the same instant
        ({"at": AT}, {"at": AT.replace(tzinfo=None)}),  # naive: taken as UTC, as Table Storage takes it
        ({"nan": float("nan"), "int64": 2**60}, {"int64": 2**60, "nan": float("nan")}),
    ],
    ids=["member order", "number spelling", "time zone", "naive time", "beyond RFC 8785"],
)
def test_equal_data_in_another_form_has_one_fingerprint(first: dict[str, object], again: dict[str, object]) -> None:
    assert state_fingerprint(first) == state_fingerprint(again)


@pytest.mark.parametrize(
    ("first", "other"),
    [
        ({"s": "paid"}, {"s": "cancelled"}),
        ({"a": [1, 2]}, {"a": [2, 1]}),  # a list's order is data
        ({"a": 1}, {"a": True}),
        ({"a": None}, {}),
        ({"at": AT}, {"at": AT.isoformat(timespec="microseconds")}),  # a time is not its text
        ({"b": b"ab"}, {"b": "6162"}),  # nor bytes their hex
        ({"b": b"ab"}, {"b": {"\x00B": "6162"}}),  # nor a member named as the tag
        ({"\x00B": "6162"}, {"\x0030": "6162"}),  # escaped names never meet
        ({"i": 2**60}, {"i": {"\x00I": str(2**60)}}),
        ({"i": 2**60}, {"i": float(2**60)}),  # an Int64 is exact, a double is not
        ({"s": "\ud800"}, {"s": "\\ud800"}),  # a lone surrogate is not its escape
        ({"s": "\ud800"}, {"s": "\ud801"}),
        ({"\ud800": 1}, {"\ud801": 1}),
    ],
    ids=[
        "value",
        "list order",
        "1 and true",
        "null and absent",
        "time and text",
        "bytes and hex",
        "bytes and tag",
        "NUL names",
        "int64 and tag",
        "int64 and double",
        "surrogate and escape",
        "two surrogates",
        "surrogate names",
    ],
)
def test_other_data_has_another_fingerprint(first: dict[str, object], other: dict[str, object]) -> None:
    assert state_fingerprint(first) != state_fingerprint(other)


def test_a_value_no_store_holds_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="set"):
        state_fingerprint({"tags": {"a", "b"}})
    store = MemoryStore()
    with pytest.raises(TypeError):
        store.upsert_if_newer("p", Entity("status", {"tags": {"a"}}), 1)
    assert store.read_state("p", "status") is None  # nothing written
