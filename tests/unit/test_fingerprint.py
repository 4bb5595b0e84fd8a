from __future__ import annotations

import json

import pytest

from shared.idempotency import InvalidMessage
from shared.idempotency.payload import fingerprint


def test_reserialised_equal_payloads_match() -> None:
    a = json.loads('{"b": [1, 2.0, "é"], "a": 1e2}')
    b = json.loads('{ "a" : 100, "b" : [1, 2, "\\u00e9"] }')
    assert fingerprint(a) == fingerprint(b)


def test_different_payloads_differ() -> None:
    assert fingerprint({"amount": 10}) != fingerprint({"amount": 11})
    assert fingerprint({"a": "1"}) != fingerprint({"a": 1})


def test_values_without_canonical_form_are_invalid() -> None:
    with pytest.raises(InvalidMessage) as info:
        fingerprint({"n": 2**60})
    assert info.value.reason == "not_i_json"
