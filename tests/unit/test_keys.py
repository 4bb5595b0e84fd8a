from __future__ import annotations

import pytest

from shared.idempotency import InvalidMessage, from_body_field, from_message_id
from shared.idempotency.keys import MAX_KEY_LENGTH, DedupKey, cloudevent_identity


def test_key_needs_an_identity() -> None:
    with pytest.raises(InvalidMessage) as info:
        DedupKey("orders", "")
    assert info.value.reason == "missing_key"


def test_key_length_is_bounded() -> None:
    DedupKey("orders", "x" * MAX_KEY_LENGTH)
    with pytest.raises(InvalidMessage) as info:
        DedupKey("orders", "x" * (MAX_KEY_LENGTH + 1))
    assert info.value.reason == "key_too_long"


def test_scope_separates_consumers() -> None:
    assert DedupKey("billing", "m1") != DedupKey("shipping", "m1")


def test_key_sources() -> None:
    assert from_message_id("m-1", {"orderId": "o-1"}) == "m-1"
    by_order = from_body_field("orderId")
    assert by_order(None, {"orderId": "o-1"}) == "o-1"
    assert by_order("m-1", {"orderId": 7}) is None  # a number is not a key: invalid
    assert by_order("m-1", ["orderId"]) is None


def test_cloudevent_identity_is_injective() -> None:
    assert cloudevent_identity("a", "b/c") != cloudevent_identity("a/b", "c")
    assert cloudevent_identity('a","b', "c") != cloudevent_identity("a", 'b","c')
    with pytest.raises(InvalidMessage):
        cloudevent_identity("", "1")
    with pytest.raises(InvalidMessage):
        cloudevent_identity("src", None)
