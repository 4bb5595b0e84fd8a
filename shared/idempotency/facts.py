"""What a consumer keeps of each Service Bus delivery for the audit (the audit package), beside what it
records anyway: a duplicate's own record, and a canary's marker. The marker and the dead-letter
record carry the delivery's sequence number themselves (``Delivery.sequence``). And what a
resubmission keeps (resend.py): the number of each dead-lettered message it sent again."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .config import retention
from .keys import DedupKey, consumer_partition
from .messages import Delivery, Result, in_utc, utcnow
from .stores._base import DedupStore
from .stores._records import Marker, State

CANARY_PROPERTY = "dedup-canary"  # an application property: the message is a canary, not business ...
CANARY_PREFIX = "dedup-canary-"  # ... when its MessageId starts so too: a property set by mistake skips no handler
DUPLICATES = "seen"  # scope suffix of a duplicate's own record: ``<consumer>|seen``
CANARY_TYPE, CANARY_SOURCE = "dedup.canary", "/dedup/canary"  # an Event Grid canary: a CloudEvent of these
CANARIES = "canary"  # scope suffix of a canary's marker: ``<consumer>|canary``
RESENT = "resent"  # scope suffix of a resubmitted message's record: ``<consumer>|resent``
# An application property: the dedup key of a message sent again under a new MessageId (resend.py),
# taken by the Service Bus trigger as its MessageId
KEY_PROPERTY = "dedup-key"
# ... and when the original was first enqueued (ISO 8601): its age, for the consumer's refusal of a
# message older than its marker is sure to be kept (``Delivery.first_enqueued_at``)
ENQUEUED_PROPERTY = "dedup-enqueued-at"


def first_enqueued(properties: Mapping[str, Any]) -> datetime | None:
    """The original's first enqueued time a resubmission carries (``ENQUEUED_PROPERTY``), or None."""
    text = properties.get(ENQUEUED_PROPERTY)
    try:
        found = datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None
    return in_utc(found)


def is_canary(delivery: Delivery) -> bool:
    return CANARY_PROPERTY in delivery.properties and (delivery.message_id or "").startswith(CANARY_PREFIX)


def canary_key(scope: str, delivery: Delivery) -> DedupKey:
    return DedupKey(f"{scope}|{CANARIES}", delivery.message_id or "")


def record_duplicate(store: DedupStore, scope: str, delivery: Delivery, result: Result, expires_at: datetime) -> None:
    """Keep a duplicate's own delivery for the audit: one conditional insert keyed by its
    sequence number (the same delivery again writes nothing). A redelivery of the message the
    marker records costs it too: the consumer cannot tell without reading the marker.

    :raises StoreUnavailable: the fact may be missing: the delivery must go back to the broker."""
    if delivery.sequence is None or result.key is None:
        return
    _record(store, f"{scope}|{DUPLICATES}", delivery.sequence, delivery.enqueued_at, expires_at,
            fingerprint=result.fingerprint or "", result={"key": result.key.id})  # fmt: skip


def record_resent(store: DedupStore, scope: str, sequence: int, enqueued_at: datetime | None) -> None:
    """A dead-lettered message sent again (resend.py): its number leaves the dead-letter queue,
    and this record, kept as long as markers (DEDUP_RETENTION), keeps it there for the audit
    (one insert; the same again writes nothing)."""
    _record(store, f"{scope}|{RESENT}", sequence, enqueued_at, utcnow() + retention())


def _record(store: DedupStore, scope: str, sequence: int, enqueued_at: datetime | None, expires_at: datetime,
            fingerprint: str = "", result: dict[str, str] | None = None) -> None:  # fmt: skip
    """A fact of one sequence number: a completed marker of its own, inserted once."""
    key = DedupKey(scope, str(sequence))
    store.insert(Marker(key, consumer_partition(key.scope, key.id), State.COMPLETED, fingerprint, utcnow(),
                        expires_at, result=result, sequence=sequence, enqueued_at=enqueued_at))  # fmt: skip
