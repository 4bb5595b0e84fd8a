"""Payload fingerprints: SHA-256 of the RFC 8785 (JCS) canonical JSON form, so that two
serialisations of the same value (key order, whitespace, number spelling) match."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from .errors import InvalidMessage


def fingerprint(payload: Any) -> str:
    try:
        canonical = rfc8785.dumps(payload)
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:  # a lone surrogate in a member name, too
        # RFC 8785 is defined on I-JSON: integers beyond 2**53, NaN and lone surrogates
        # have no canonical form, so two copies could not be compared reliably.
        raise InvalidMessage("not_i_json", str(exc)) from exc
    return hashlib.sha256(canonical).hexdigest()
