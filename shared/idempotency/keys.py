"""Stable dedup keys: (consumer identity, message identity).

A key is never derived from what the broker regenerates on redelivery (lock token,
delivery count, sequence number, enqueued time): those change between deliveries of
the same logical message and would let every redelivery through.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidMessage

MAX_KEY_LENGTH = 16_384  # stores keep the full key beside its encoded form


@dataclass(frozen=True, order=True)
class DedupKey:
    """Scope is the consumer's configured identity, so consumers sharing a store never
    block each other; id is the logical message's identity."""

    scope: str
    id: str

    def __post_init__(self) -> None:
        if not self.scope:
            raise ValueError("a dedup key needs a consumer scope")
        if not self.id:
            raise InvalidMessage("missing_key", "the message has no dedup key")
        if len(self.id) > MAX_KEY_LENGTH:
            raise InvalidMessage("key_too_long", f"dedup keys are limited to {MAX_KEY_LENGTH} characters")

    def __str__(self) -> str:
        return f"{self.scope}/{self.id}"


KeySource = Callable[[str | None, Any], str | None]
"""Extracts the message identity from (producer MessageId, parsed payload)."""


def from_message_id(message_id: str | None, payload: Any) -> str | None:
    """The producer-assigned MessageId (the pattern's default)."""
    return message_id


def from_body_field(field: str) -> KeySource:
    """A business idempotency key carried in the payload, e.g. ``orderId``."""

    def extract(message_id: str | None, payload: Any) -> str | None:
        value = payload.get(field) if isinstance(payload, dict) else None
        return value if isinstance(value, str) else None

    return extract


def cloudevent_identity(source: str | None, event_id: str | None) -> str:
    """CloudEvents 1.0: (source, id) is unique per event. Joined as a JSON array so
    that no two distinct pairs can produce the same identity."""
    if not source or not event_id:
        raise InvalidMessage("missing_key", "a CloudEvent needs both source and id")
    return json.dumps([source, event_id], ensure_ascii=False, separators=(",", ":"))
