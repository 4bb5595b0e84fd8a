"""Reconciliation of two-phase claims left in progress: a claim whose lease expired a
little while ago is left for the next delivery to take over; one whose lease expired
long ago (its message is no longer being redelivered) is escalated to operators —
never silently marked completed, since nobody knows whether its call happened. (A call
the service refused for good is not stuck: its step is recorded ``refused``.)"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta

from opentelemetry import metrics

from . import telemetry
from .errors import VersionConflict
from .messages import utcnow
from .stores._base import DedupStore
from .stores._records import DeadLetter, Marker, State

log = logging.getLogger("idempotency")
_escalations = metrics.get_meter("idempotency").create_counter(
    "dedup.escalations", description="Claims stuck in progress, escalated to operators"
)

ESCALATION = "stale_claim"


def escalate_stale_claims(
    store: DedupStore, stale_after: timedelta, *, page: int = 500, budget: int = 10_000, now: datetime | None = None
) -> list[Marker]:
    """Escalate claims whose lease expired more than ``stale_after`` ago, each once: a
    record in the dead-letter table (reason ``stale_claim``), an ERROR log and a metric,
    then the claim is marked ``escalated`` (fenced by its version), which takes it out of
    the next scan — so every run moves on to the claims not yet escalated, page by page,
    up to ``budget``. An escalated claim keeps its lease and fingerprint: a resubmission
    of the same payload can still take it over."""
    cutoff = (now or utcnow()) - stale_after
    escalated: list[Marker] = []
    while len(escalated) < budget:
        stale = store.stale_claims(cutoff, min(page, budget - len(escalated)))
        moved = [marker for marker in stale if _escalate(store, marker)]
        escalated += moved
        if not moved:  # nothing left, or every one of them changed meanwhile
            break
    if escalated:
        log.error("dedup reconciliation escalated %d stuck claim(s)", len(escalated))
    return escalated


def _escalate(store: DedupStore, marker: Marker) -> bool:
    summary = {
        "step": marker.key.step,
        "owner": marker.owner,
        "leaseUntil": marker.lease_until.isoformat() if marker.lease_until else None,
        "partition": marker.partition,
    }
    # The record first (idempotent by its id), so that no escalation is ever lost.
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
    try:
        store.replace(replace(marker, state=State.ESCALATED), marker.version or "")
    except VersionConflict:
        return False  # taken over or completed since the scan: no longer stuck
    _escalations.add(1, {"consumer": marker.key.scope})
    log.error(
        "dedup claim stuck in progress: consumer=%r dedup_key=%r step=%r lease_until=%s",
        marker.key.scope, marker.key.id, marker.key.step, summary["leaseUntil"],
        extra=telemetry.extra({"consumer": marker.key.scope, "outcome": "escalated", "dedup_key": marker.key.id}),
    )  # fmt: skip
    return True
