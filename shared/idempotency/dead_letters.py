"""What a consumer records for an operator: a message it refuses (invalid, conflicting)
before acknowledging it, one that still fails on the broker's last delivery before the
broker dead-letters it, and an event parked for replay (its source moved on). The record
holds the body, ids, reason and fingerprints (stores' ``dead_letter``); an operator lists and
exports them with ``python -m shared.idempotency.dead_letter_records``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from . import telemetry, wait
from .messages import Delivery, Outcome, Result
from .reasons import Reason
from .stores._base import DedupStore
from .stores._records import DeadLetter


def record(store: DedupStore, scope: str, delivery: Delivery, result: Result) -> Result:
    """Record it durably; if that fails, TRANSIENT ``dead_letter_failed``: the message must
    go back to the broker instead of being acknowledged."""
    letter = DeadLetter(scope, result.reason or result.outcome.value, result.detail or "", delivery.body,
                        delivery.message_id, delivery.correlation_id, delivery.delivery_count,
                        result.key.id if result.key else None, result.fingerprint,
                        result.stored_fingerprint, sequence=delivery.sequence,
                        enqueued_at=delivery.enqueued_at)  # fmt: skip
    try:
        store.dead_letter(letter)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the broker keeps the message
        return Result(Outcome.TRANSIENT, result.key, Reason.DEAD_LETTER_FAILED, repr(exc)[:500])
    return result


# How long a park the store refuses is tried again (within the delivery's own wait, if shorter):
# a store that blinks on the last try (a failover, a burst of 503s) must not lose the events, and
# the last try stays within functionTimeout (`make check-leases` counts it).
PARK_WAIT = timedelta(seconds=15)


def park(store: DedupStore, scope: str, failing: Sequence[tuple[Delivery, Result]],
         patience: timedelta) -> list[Result]:  # fmt: skip
    """Keep messages the source will not deliver again (an Event Hubs checkpoint moved past
    them) with reason ``parked`` and why, for an operator to replay (``python -m
    shared.idempotency.replay``). Those the store could not record are tried again within
    ``patience`` (``wait.within``; at most PARK_WAIT). Each one's final outcome: PARKED, or
    TRANSIENT ``dead_letter_failed``."""
    parked = [replace(result, outcome=Outcome.PARKED, reason=Reason.PARKED,
                      detail=f"{result.reason or result.outcome.value}: {result.detail or ''}"[:500])
              for _, result in failing]  # fmt: skip
    recorded = wait.within(min(patience, PARK_WAIT), len(failing),
                           lambda at, _: [record(store, scope, failing[i][0], parked[i]) for i in at])  # fmt: skip
    for (delivery, _), result in zip(failing, recorded, strict=True):
        span = telemetry.span(scope, delivery)  # counted again as its final outcome: the delivery was transient
        try:
            telemetry.record(scope, delivery, result, 0.0, span)
        finally:
            span.end()
    return recorded
