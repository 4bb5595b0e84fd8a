"""How markers and dead-letter records are laid out, in every store: one field map, so
that the stores agree on what a record holds. Each store only renames fields to its
convention (Table Storage: PascalCase) and encodes values its SDK cannot take as they are
(Table: JSON text; Cosmos DB: times as fixed-width strings). The message's body and the
store's own ids are the store's business."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import rfc8785

from ..keys import DedupKey
from ._records import MARKER_KIND, DeadLetter, Marker, State

# Bytes of a message's body a dead-letter record keeps whole, in every store: the largest
# Event Hubs event and the default largest Service Bus Premium message (1 MiB, properties
# included). A longer body is kept as its head, with its length and SHA-256 (``kept``).
MAX_DEAD_LETTER_BODY = 1_048_576
DETAIL_LIMIT = 8_000  # characters of a refusal's detail kept with a dead letter
ID_LIMIT = 1_024  # characters of an id kept with a dead letter (a property holds 32 K; the body needs the room)
# Every field a marker may carry (optional ones are left out when empty): a business
# document that is its own marker (Cosmos DB, one document) must use none of them.
MARKER_FIELDS = frozenset({"kind", "scope", "keyId", "state", "fingerprint", "createdAt", "expiresAt", "step",
                           "result", "leaseUntil", "owner", "partition", "sequence", "enqueuedAt",
                           "requestOrigin"})  # fmt: skip


def marker_fields(marker: Marker) -> dict[str, Any]:
    """A marker's fields; absent ones are left out (each costs encoding time per commit)."""
    fields: dict[str, Any] = {
        "kind": MARKER_KIND,
        "scope": marker.key.scope,
        "keyId": marker.key.id,
        "state": marker.state.value,
        "fingerprint": marker.fingerprint,
        "createdAt": marker.created_at,
        "expiresAt": marker.expires_at,
    }
    optional = {
        "step": marker.key.step or None,
        "result": marker.result,
        "leaseUntil": marker.lease_until,
        "owner": marker.owner,
        # the raw partition, for reconciliation's cross-partition scan of claims
        "partition": marker.partition if marker.claimed else None,
        # text: a partitioned entity's sequence numbers pass 2**53 (the partition in the high bits)
        "sequence": None if marker.sequence is None else str(marker.sequence),
        "enqueuedAt": marker.enqueued_at,
        "requestOrigin": marker.origin,
    }
    fields.update({name: value for name, value in optional.items() if value is not None})
    return fields


def marker_from(fields: Mapping[str, Any], partition: str, version: str | None) -> Marker:
    return Marker(
        key=DedupKey(fields["scope"], fields["keyId"], fields.get("step") or ""),
        partition=partition,
        state=State(fields["state"]),
        fingerprint=fields["fingerprint"],
        created_at=fields.get("createdAt") or fields["expiresAt"],
        expires_at=fields["expiresAt"],
        lease_until=fields.get("leaseUntil"),
        result=fields.get("result"),
        owner=fields.get("owner"),
        version=version,
        sequence=_sequence(fields.get("sequence")),
        enqueued_at=fields.get("enqueuedAt"),
        origin=fields.get("requestOrigin"),
    )


def _sequence(text: str | None) -> int | None:
    return None if text is None else int(text)


def kept(record: DeadLetter) -> DeadLetter:
    """The record as a store keeps it: whole when its body fits MAX_DEAD_LETTER_BODY; else
    the body's head, its full length and SHA-256, and a detail that says so. A store that
    answers records every refused message, rather than leave it to a source that may not
    keep it (an Event Hubs checkpoint moves on)."""
    if len(record.body) <= MAX_DEAD_LETTER_BODY:
        return record
    digest = hashlib.sha256(record.body).hexdigest()
    note = (f"body truncated: the first {MAX_DEAD_LETTER_BODY} of {len(record.body)} bytes are kept "
            f"(sha256 of the whole {digest}); ")  # fmt: skip
    return replace(record, body=record.body[:MAX_DEAD_LETTER_BODY], detail=note + record.detail,
                   body_size=len(record.body), body_sha256=digest)  # fmt: skip


def dead_letter_fields(record: DeadLetter, recorded_at: datetime, expires_at: datetime) -> dict[str, Any]:
    """A dead letter's fields but its body (of the record as ``kept``)."""
    fields: dict[str, Any] = {
        "scope": record.scope,
        "reason": record.reason,
        "detail": bounded(record.detail, DETAIL_LIMIT),
        "recordedAt": recorded_at,
        "expiresAt": expires_at,
    }
    optional = {
        "messageId": bounded(record.message_id, ID_LIMIT),
        "correlationId": bounded(record.correlation_id, ID_LIMIT),
        "deliveryCount": record.delivery_count,
        "keyId": bounded(record.key_id, ID_LIMIT),
        "fingerprint": record.fingerprint,
        "storedFingerprint": record.stored_fingerprint,
        "bodySize": record.body_size,
        "bodySha256": record.body_sha256,
        "sequence": None if record.sequence is None else str(record.sequence),
        "enqueuedAt": record.enqueued_at,
    }
    fields.update({name: value for name, value in optional.items() if value is not None})
    return fields


def bounded(text: str | None, limit: int) -> str | None:
    """``text`` if it fits, else its head and the SHA-256 of the whole: still tells one
    message from another, and a record of a hostile message still fits the store. Lone
    surrogates (no store can hold them) are written as their escapes."""
    if text is None:
        return None
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    note = f"…[{len(text)} characters, sha256 {digest}]"
    return text[: limit - len(note)] + note


def dead_letter_from(fields: Mapping[str, Any], body: bytes) -> DeadLetter:
    return DeadLetter(
        scope=fields["scope"],
        reason=fields["reason"],
        detail=fields["detail"],
        body=body,
        message_id=fields.get("messageId"),
        correlation_id=fields.get("correlationId"),
        delivery_count=fields.get("deliveryCount"),
        key_id=fields.get("keyId"),
        fingerprint=fields.get("fingerprint"),
        stored_fingerprint=fields.get("storedFingerprint"),
        recorded_at=fields.get("recordedAt"),
        body_size=fields.get("bodySize"),
        body_sha256=fields.get("bodySha256"),
        sequence=_sequence(fields.get("sequence")),
        enqueued_at=fields.get("enqueuedAt"),
    )


# -- versioned state ----------------------------------------------------------------------

_EXACT = 2**53 - 1  # RFC 8785 numbers are doubles: integers beyond are tagged, never rounded


def state_fingerprint(data: Mapping[str, Any]) -> str:
    """SHA-256 of an entity's data in RFC 8785 form, so that equal data match whatever its
    members' order or its numbers' spelling (1 and 1.0, 0.10 and 0.1): what tells a
    redelivered version from another payload under the same version. Values RFC 8785 has
    no form for (times, bytes, integers beyond 2**53, NaN and infinities, lone surrogates)
    are written as one-member objects named NUL and a capital letter, a name no member
    takes (one that starts with NUL is written as NUL and its UTF-8 in hex).

    :raises TypeError: a value no store holds (``check_storable``)."""
    return hashlib.sha256(rfc8785.dumps(_canonical(data))).hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, str):
        return value if _utf8(value) else {"\x00S": value.encode("utf-8", "surrogatepass").hex()}
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -_EXACT <= value <= _EXACT else {"\x00I": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"\x00F": repr(value)}
    if isinstance(value, Mapping):
        return {_member(name): _canonical(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, datetime):  # the instant, naive taken as UTC (as Table Storage takes it)
        at = value if value.tzinfo else value.replace(tzinfo=UTC)
        return {"\x00T": at.astimezone(UTC).isoformat(timespec="microseconds")}
    if isinstance(value, bytes):
        return {"\x00B": value.hex()}
    raise TypeError(f"a {type(value).__name__} is not a storable value")


def _member(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a {type(name).__name__} member name is not storable")
    if name.startswith("\x00") or not _utf8(name):
        return "\x00" + name.encode("utf-8", "surrogatepass").hex()
    return name


def _utf8(text: str) -> bool:
    """No lone surrogate (which has no UTF-8, so no RFC 8785 form)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
