"""What a message's payload is: the strict JSON parser every trigger and tool shares, and
the payload's fingerprint, SHA-256 of its RFC 8785 (JCS) canonical JSON form, so that two
serialisations of the same value (key order, whitespace, number spelling) match."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import rfc8785

from .errors import InvalidMessage
from .reasons import Reason


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(canonical(payload)).hexdigest()


def canonical(payload: Any) -> bytes:
    """The RFC 8785 form: the C encoder's sorted, compact output where it is that form (every
    key ASCII, every number an I-JSON integer or spelled alike; a third of rfc8785's
    instructions), else rfc8785's (tests/unit/test_fingerprint.py checks the two agree)."""
    try:
        return _compact_sorted(_plain(payload)).encode("utf-8")
    except (_Irregular, UnicodeError):  # rfc8785 spells it, or says why it cannot
        pass
    try:
        return rfc8785.dumps(payload)
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:  # a lone surrogate in a member name, too
        # RFC 8785 is defined on I-JSON: integers beyond 2**53, NaN and lone surrogates
        # have no canonical form, so two copies could not be compared reliably.
        raise InvalidMessage(Reason.NOT_I_JSON, str(exc)) from exc


_compact_sorted = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_SAFE_INTEGER = 2**53 - 1  # I-JSON's: rfc8785 refuses what is past it


class _Irregular(Exception):
    """A value the C encoder would not spell as RFC 8785 does."""


def _plain(value: Any) -> Any:
    """``value`` with its integral floats as ints (RFC 8785 spells 12.0 "12", Python "12.0"); a
    float Python spells as RFC 8785 does (non-integral, from 1e-4: both fixed, shortest) as it
    is; _Irregular for anything else: a non-ASCII key (RFC 8785 orders keys by UTF-16), another
    float, an integer past I-JSON's, a type JSON does not have."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
            return value
    elif kind is float:
        if value.is_integer() and abs(value) <= _SAFE_INTEGER:
            return int(value)
        if 1e-4 <= abs(value) < 1e16 and not value.is_integer():
            return value
    elif kind is dict:
        changed = None
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise _Irregular
            plain = _plain(item)
            if plain is not item:
                changed = changed if changed is not None else dict(value)
                changed[key] = plain
        return value if changed is None else changed
    elif kind is list:
        items = [_plain(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    raise _Irregular


MAX_JSON_DEPTH = 32
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(body: bytes) -> Any:
    """Strict JSON: no NaN/Infinity, no duplicate member names (which copy would win
    differs between parsers, so the fingerprint could not mean the same payload), nesting
    at most MAX_JSON_DEPTH deep."""

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        members = dict(pairs)
        if len(members) != len(pairs):
            raise InvalidMessage(Reason.DUPLICATE_MEMBER, "an object repeats a member name")
        if not all(name.isascii() or not _SURROGATE.search(name) for name in members):
            # values are refused by the fingerprint (RFC 8785); names must be text too
            raise InvalidMessage(Reason.NOT_I_JSON, "a member name holds a lone surrogate")
        return members

    try:
        payload = json.loads(body.decode("utf-8"), parse_constant=reject_constant, object_pairs_hook=unique_members)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(Reason.INVALID_JSON, str(exc)[:500]) from exc
    _check_depth(payload)
    return payload


def _check_depth(payload: Any) -> None:
    level = [payload]
    for _ in range(MAX_JSON_DEPTH):
        level = [child for value in level if isinstance(value, dict | list)
                 for child in (value.values() if isinstance(value, dict) else value)]  # fmt: skip
        if not level:
            return
    if any(isinstance(value, dict | list) for value in level):
        raise InvalidMessage(Reason.TOO_DEEP, f"JSON nesting is limited to {MAX_JSON_DEPTH} levels")
