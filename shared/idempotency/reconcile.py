"""Reconciliation of two-phase claims left in progress: a claim whose lease expired a
little while ago is left for the next delivery to take over; one whose lease expired
long ago (its message is no longer being redelivered) is escalated to operators —
never silently marked completed, since nobody knows whether its call happened."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

from opentelemetry import metrics

from .records import Marker, utcnow
from .store import DeadLetter, DedupStore

log = logging.getLogger("idempotency")
_escalations = metrics.get_meter("idempotency").create_counter(
    "dedup.escalations", description="Claims stuck in progress, escalated to operators"
)

ESCALATION = "stale_claim"


def escalate_stale_claims(
    store: DedupStore, stale_after: timedelta, *, limit: int = 500, now: datetime | None = None
) -> list[Marker]:
    """Escalate claims whose lease expired more than ``stale_after`` ago: an ERROR log, a
    metric, and a record in the dead-letter table (reason ``stale_claim``) for operators.
    Idempotent: a claim escalated twice has one record."""
    cutoff = (now or utcnow()) - stale_after
    stale = store.stale_claims(cutoff, limit)
    for marker in stale:
        summary = {
            "step": marker.key.step,
            "owner": marker.owner,
            "leaseUntil": marker.lease_until.isoformat() if marker.lease_until else None,
            "partition": marker.partition,
        }
        store.dead_letter(
            DeadLetter(
                scope=marker.key.scope,
                reason=ESCALATION,
                detail=f"step {marker.key.step or '(message)'} in progress; lease expired at {summary['leaseUntil']}",
                body=json.dumps(summary, sort_keys=True).encode(),
                key_id=marker.key.id,
                fingerprint=marker.fingerprint,
            )
        )
        _escalations.add(1, {"consumer": marker.key.scope})
        log.error(
            "dedup claim stuck in progress: consumer=%r dedup_key=%r step=%r lease_until=%s",
            marker.key.scope, marker.key.id, marker.key.step, summary["leaseUntil"],
            extra={"dedup": {"consumer": marker.key.scope, "outcome": "escalated", "dedup_key": marker.key.id}},
        )  # fmt: skip
    return stale
