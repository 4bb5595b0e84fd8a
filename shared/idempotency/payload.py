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
    try:
        canonical = rfc8785.dumps(payload)
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:  # a lone surrogate in a member name, too
        # RFC 8785 is defined on I-JSON: integers beyond 2**53, NaN and lone surrogates
        # have no canonical form, so two copies could not be compared reliably.
        raise InvalidMessage(Reason.NOT_I_JSON, str(exc)) from exc
    return hashlib.sha256(canonical).hexdigest()


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
