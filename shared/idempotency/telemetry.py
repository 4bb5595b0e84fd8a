"""One structured log line and one count per outcome; the metrics go through the
OpenTelemetry API, so they reach whatever exporter the app configured (none: no-op)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from opentelemetry import metrics

if TYPE_CHECKING:
    from .consumer import Delivery, Result

log = logging.getLogger("idempotency")
_meter = metrics.get_meter("idempotency")
_outcomes = _meter.create_counter("dedup.outcomes", description="Messages by consumer and outcome")
_duplicates = _meter.create_counter("dedup.duplicates", description="Duplicate deliveries suppressed")
_duration = _meter.create_histogram("dedup.duration", unit="ms", description="Time to reach an outcome")

# Outcomes an operator must look at are logged as errors: they are the alerts.
_LEVELS = {"conflict": logging.ERROR, "invalid": logging.WARNING, "transient": logging.WARNING}


def record(consumer: str, delivery: Delivery, result: Result, duration_ms: float) -> None:
    outcome = result.outcome.value
    fields = {
        "consumer": consumer,
        "outcome": outcome,
        "dedup_key": result.key.id if result.key else None,
        "message_id": delivery.message_id,
        "correlation_id": delivery.correlation_id,
        "delivery_count": delivery.delivery_count,
        "reason": result.reason,
        "fingerprint": result.fingerprint,
        "stored_fingerprint": result.stored_fingerprint,
    }
    shown = " ".join(f"{name}={value!r}" for name, value in fields.items() if value is not None)
    log.log(_LEVELS.get(outcome, logging.INFO), "dedup %s", shown, extra={"dedup": fields})
    attributes = {"consumer": consumer, "outcome": outcome}
    _outcomes.add(1, attributes)
    _duration.record(duration_ms, attributes)
    if outcome == "duplicate":
        _duplicates.add(1, {"consumer": consumer})
