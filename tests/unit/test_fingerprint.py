from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.idempotency import InvalidMessage
from shared.idempotency.payload import canonical, fingerprint


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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([12.0, -0.0, 1e-4, 9.9e-5, 1e-7, 1e16, 2.0**53, 1e21, 0.1, 123.456]) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@pytest.mark.long("3,000 generated values")
@settings(max_examples=3000, deadline=None)
@given(JSON_VALUES)
@example({"\ue000": 1, "\U0001f600": 2})  # UTF-16 puts the astral key first, code points the other
@example([1e-5, 1e21, 2.0**53 + 2, 2**53, "\ud800"])
def test_the_fast_canonical_form_is_rfc8785s(value: object) -> None:
    """The C encoder's path (canonical) spells every value as rfc8785 does, or both refuse it."""
    try:
        expected: bytes | None = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError):
        expected = None
    if expected is None:
        with pytest.raises(InvalidMessage):
            canonical(value)
    else:
        assert canonical(value) == expected
