from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from hypothesis import given
from hypothesis import strategies as st

from shared.idempotency.keys import DedupKey, encode_key, marker_id

HOSTILE = ["a/b", "a#b", "a?b", "a\\b", "a\x00b", "a\x7fb", "a\u0085b", "é", "🙂", "%2F", "~x", "a|b", "'", "x" * 2048]
FORBIDDEN = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")


def test_hostile_keys_encode_to_table_safe_text() -> None:
    for value in HOSTILE:
        encoded = encode_key(value)
        assert not FORBIDDEN.search(encoded), value
        assert len(encoded.encode("utf-16-le")) <= 1024


def test_encoding_is_injective_on_hostile_keys() -> None:
    encoded = [encode_key(value) for value in HOSTILE]
    assert len(set(encoded)) == len(HOSTILE)


@given(st.text(max_size=600), st.text(max_size=600))
def test_distinct_values_never_collide(a: str, b: str) -> None:
    if a != b:
        assert encode_key(a) != encode_key(b)
        assert marker_id(DedupKey("s", a or "x")) != marker_id(DedupKey("s", b or "x")) or (a or "x") == (b or "x")


def test_scope_and_id_cannot_be_confused() -> None:
    assert marker_id(DedupKey("a|b", "c")) != marker_id(DedupKey("a", "b|c"))


def _percent_encoded(value: str) -> str:
    """The encoding's definition: stored ids depend on it, so it may never drift."""
    encoded = quote(value.encode("utf-8", "surrogatepass"), safe="").replace("~", "%7E")
    return encoded if len(encoded) <= 400 else "~" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


@given(st.text(alphabet=st.sampled_from("aZ09_.-|~/%é"), max_size=450) | st.text(max_size=450))
def test_the_fast_path_encodes_exactly_as_percent_encoding_does(value: str) -> None:
    assert encode_key(value) == _percent_encoded(value)


def test_every_ascii_character_encodes_as_percent_encoding_does() -> None:
    for code in range(128):
        for value in (chr(code), f"a{chr(code)}b|c"):
            assert encode_key(value) == _percent_encoded(value), code
