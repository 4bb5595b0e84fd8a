"""Stable dedup keys: (consumer identity, message identity), and their encoding into
store ids (Table PartitionKey/RowKey, Cosmos id), which forbid ``/ \\ # ?``.

A key is never derived from what the broker regenerates on redelivery (lock token,
delivery count, sequence number, enqueued time): those change between deliveries of
the same logical message and would let every redelivery through.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .errors import InvalidMessage
from .reasons import Reason

MAX_KEY_LENGTH = 16_384  # stores keep the full key beside its encoded form
MAX_ENCODED = 400  # an encoded part stays well inside the stores' 1 KiB key limits
_PLAIN = re.compile("[A-Za-z0-9_.|-]*")  # what quote(safe="") leaves alone ("~" aside), and "|"
_DOWNSTREAM_NAMESPACE = uuid.UUID("6f0d9c52-5a0e-4d0b-9a43-3c1f2f0e7a11")  # fixed: keys must never change


@dataclass(frozen=True, order=True)
class DedupKey:
    """Scope is the consumer's configured identity, so consumers sharing a store never
    block each other; id is the logical message's identity; step names one external
    effect of that message (two-phase path), empty for the message itself."""

    scope: str
    id: str
    step: str = ""

    def __post_init__(self) -> None:
        if not self.scope:
            raise ValueError("a dedup key needs a consumer scope")
        if not self.id:
            raise InvalidMessage(Reason.MISSING_KEY, "the message has no dedup key")
        if len(self.id) > MAX_KEY_LENGTH:
            raise InvalidMessage(Reason.KEY_TOO_LONG, f"dedup keys are limited to {MAX_KEY_LENGTH} characters")

    def __str__(self) -> str:
        return f"{self.scope}/{self.id}" + (f"#{self.step}" if self.step else "")

    def for_step(self, step: str) -> DedupKey:
        if not step:
            raise ValueError("a step needs a name")
        return DedupKey(self.scope, self.id, step)

    @property
    def downstream_key(self) -> str:
        """The Idempotency-Key sent to the service a step calls: derived only from
        (consumer, message, step), so it is the same on every retry and takeover."""
        name = json.dumps([self.scope, self.id, self.step], ensure_ascii=False, separators=(",", ":"))
        return str(uuid.uuid5(_DOWNSTREAM_NAMESPACE, name))


def encode_key(value: str) -> str:
    """Injective, Table-safe encoding of any string into a PartitionKey/RowKey part.

    Percent-encoding removes ``/ \\ # ?``, control characters and our ``|`` separator;
    ``~`` is encoded as well so that the ``~``-prefixed hashed form of long values can
    never equal the encoded form of a short one.
    """
    if _PLAIN.fullmatch(value):  # quote's result, without its per-byte cost
        encoded = value.replace("|", "%7C")
    else:
        encoded = quote(value.encode("utf-8", "surrogatepass"), safe="").replace("~", "%7E")
    if len(encoded) <= MAX_ENCODED:
        return encoded
    return "~" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def marker_id(key: DedupKey) -> str:
    """``dedup|<scope>|<id>``, and ``|@<step>`` for a step's marker. Encoded parts never
    contain ``|`` or ``@``, and a guard's suffix is hexadecimal: no two rows collide."""
    row = f"dedup|{encode_key(key.scope)}|{encode_key(key.id)}"
    return f"{row}|@{encode_key(key.step)}" if key.step else row


def guard_id(key: DedupKey, fingerprint: str) -> str:
    """The atomic path's (key, fingerprint) guard: its existence means "same payload"."""
    return f"{marker_id(key)}|{fingerprint}"


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


def from_data_field(field: str) -> KeySource:
    """A business key in a CloudEvent's ``data`` (a CloudEvents consumer's payload is the
    envelope ``{type, subject, data}``, see docs/triggers.md), e.g. ``refundId``."""
    in_body = from_body_field(field)

    def extract(message_id: str | None, payload: Any) -> str | None:
        return in_body(message_id, payload.get("data") if isinstance(payload, dict) else None)

    return extract


def consumer_partition(scope: str, partition: str) -> str:
    """Every consumer's records live in partitions of its own (``<consumer>|<partition>``):
    no message of one consumer can land in, or block, another consumer's partition.
    Consumer names never contain ``|`` (checked when a consumer is built)."""
    return f"{scope}|{partition}"


def joined_identity(*parts: str) -> str:
    """Several parts as one identity, joined as a JSON array so that no two distinct
    tuples can produce the same identity."""
    return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))


def cloudevent_identity(source: str | None, event_id: str | None) -> str:
    """CloudEvents 1.0: (source, id) is unique per event."""
    if not source or not event_id:
        raise InvalidMessage(Reason.MISSING_KEY, "a CloudEvent needs both source and id")
    return joined_identity(source, event_id)
