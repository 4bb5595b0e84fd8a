"""How markers and dead-letter records are laid out, in every store: one field map, so
that the stores agree on what a record holds. Each store only renames fields to its
convention (Table Storage: PascalCase) and encodes values its SDK cannot take as they are
(Table: JSON text; Cosmos DB: times as fixed-width strings). The message's body and the
store's own ids are the store's business."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..keys import DedupKey
from ._records import MARKER_KIND, DeadLetter, Marker, State

DETAIL_LIMIT = 8_000  # characters of a refusal's detail kept with a dead letter
ID_LIMIT = 1_024  # characters of an id kept with a dead letter (a property holds 32 K; the body needs the room)
# Every field a marker may carry (optional ones are left out when empty): a business
# document that is its own marker (Cosmos DB, one document) must use none of them.
MARKER_FIELDS = frozenset({"kind", "scope", "keyId", "state", "fingerprint", "createdAt", "expiresAt", "step",
                           "result", "leaseUntil", "owner", "partition"})  # fmt: skip


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
    )


def dead_letter_fields(record: DeadLetter, recorded_at: datetime, expires_at: datetime) -> dict[str, Any]:
    """A dead letter's fields but its body."""
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
    )
