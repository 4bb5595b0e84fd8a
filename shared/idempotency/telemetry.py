"""Observability through the OpenTelemetry API, so it reaches whatever the app configured
(Azure Monitor on Azure, a console exporter in the demo, nothing: no-op):

- one structured log line per outcome, with the dedup key and the correlation id — at
  DEBUG for the everyday ones (processed, duplicate, stale: the metrics and the span count
  them), INFO for in flight, WARNING and ERROR for what an operator must see;
- metrics: ``dedup.outcomes`` (consumer, outcome, and its reason when it has one),
  ``dedup.duplicates``, ``dedup.contended`` (consumer),
  ``dedup.duration`` and ``dedup.claim.duration`` histograms (ms),
  ``dedup.store.requests`` (every HTTP request a store client sends); elsewhere
  ``dedup.escalations`` (reconcile.py), ``dedup.outbox.swept`` (result: sent, failed;
  outbox.py) and ``dedup.purge.runs`` (budget_spent; the purge timer) — what the alerts in
  infra/modules/alerts.bicep watch;
- a span per message, continuing the producer's trace (``traceparent``), which the
  messages its handler sends carry on (``traceparent()``, outbox.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from .messages import Delivery, Result

log = logging.getLogger("idempotency")
_meter = metrics.get_meter("idempotency")
_tracer = trace.get_tracer("idempotency")
_outcomes = _meter.create_counter("dedup.outcomes", description="Messages by consumer and outcome")
_duplicates = _meter.create_counter("dedup.duplicates", description="Duplicate deliveries suppressed")
_duration = _meter.create_histogram("dedup.duration", unit="ms", description="Time to reach an outcome")
_claim = _meter.create_histogram("dedup.claim.duration", unit="ms", description="Store time to claim and commit")
_propagator = TraceContextTextMapPropagator()
_NO_PARENT = Context()  # a new trace, not the ambient one: what extract() returns for no traceparent
_requests = _meter.create_counter("dedup.store.requests", description="HTTP requests sent by the store clients")
_contended = _meter.create_counter("dedup.contended", description="Commits refused because an entity changed meanwhile")


def extra(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A log record's structured fields as attributes of their own, ``dedup_<name>`` (the key:
    ``dedup_key``), the None ones left out: each its own customDimensions entry in Application
    Insights, where a dict would arrive as one string."""
    return {name if name.startswith("dedup_") else f"dedup_{name}": value
            for name, value in fields.items() if value is not None}  # fmt: skip


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """What ``extra`` attached to a record, by the names it was given (a log handler's view)."""
    return {name if name == "dedup_key" else name.removeprefix("dedup_"): value
            for name, value in vars(record).items() if name.startswith("dedup_")}  # fmt: skip


# Outcomes an operator must look at are logged as errors: they are the alerts. The everyday
# ones log at DEBUG: through the Functions worker every record is a message to the host, and
# one per message cost the consumer a tenth of its throughput (lab/bench/worker.py: 0.75-0.84x
# the no-dedup function at INFO, 0.89-0.96x at DEBUG, in one session).
_LEVELS = {"conflict": logging.ERROR, "parked": logging.ERROR, "invalid": logging.WARNING, "transient": logging.WARNING,
           "in_flight": logging.INFO, "declined": logging.INFO}  # fmt: skip


def count_store_request(request: Any) -> None:
    """An azure-core ``raw_request_hook``: called for every request, retries included."""
    _requests.add(1, {"method": request.http_request.method})


def contended(consumer: str, key: str) -> None:
    """A commit refused because an entity it changes moved since it was read: decided again."""
    _contended.add(1, {"consumer": consumer})
    if log.isEnabledFor(logging.INFO):
        fields = {"consumer": consumer, "dedup_key": key, "reason": "contended"}
        log.info("dedup consumer=%r dedup_key=%r reason='contended'", consumer, key, extra=extra(fields))


def claim_duration(consumer: str, milliseconds: float) -> None:
    _claim.record(milliseconds, {"consumer": consumer})


def span(consumer: str, delivery: Delivery) -> trace.Span:
    """A consumer span, started but not current (``trace.use_span`` makes it current),
    child of the incoming trace context when there is one."""
    parent = _propagator.extract({"traceparent": delivery.traceparent}) if delivery.traceparent else _NO_PARENT
    attributes = {"messaging.consumer.group.name": consumer}
    if delivery.message_id:
        attributes["messaging.message.id"] = delivery.message_id
    return _tracer.start_span(f"dedup {consumer}", context=parent, kind=trace.SpanKind.CONSUMER,
                              attributes=attributes)  # fmt: skip


def traceparent() -> str | None:
    """The current span's W3C trace context (None outside a valid one): what a
    message sent on its behalf carries, so that its consumer's span continues this trace."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def record(consumer: str, delivery: Delivery, result: Result, duration_ms: float, current: trace.Span) -> None:
    outcome = result.outcome.value
    level = _LEVELS.get(outcome, logging.DEBUG)
    if log.isEnabledFor(level):
        fields = {
            "consumer": consumer,
            "outcome": outcome,
            "dedup_key": result.key.id if result.key else None,
            "message_id": delivery.message_id,
            "correlation_id": delivery.correlation_id,
            "delivery_count": delivery.delivery_count,
            "sequence": delivery.sequence,  # the broker's number, where it gives one: what the audit counts by
            "reason": None if result.reason is None else str(result.reason),  # its value, not the enum's repr
            "fingerprint": result.fingerprint,
            "stored_fingerprint": result.stored_fingerprint,
        }
        shown = " ".join(f"{name}={value!r}" for name, value in fields.items() if value is not None)
        log.log(level, "dedup %s", shown, extra=extra(fields))
    attributes = {"consumer": consumer, "outcome": outcome}
    _outcomes.add(1, attributes if result.reason is None else {**attributes, "reason": str(result.reason)})
    _duration.record(duration_ms, attributes)
    if outcome == "duplicate":
        _duplicates.add(1, {"consumer": consumer})
    current.set_attribute("dedup.outcome", outcome)
    if result.key is not None:
        current.set_attribute("dedup.key", result.key.id)
    if outcome in ("conflict", "transient", "invalid", "parked"):
        current.set_status(trace.StatusCode.ERROR, result.reason or outcome)
