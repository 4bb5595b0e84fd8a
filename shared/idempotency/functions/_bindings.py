"""The edge between Functions bindings and the dedup module: how each trigger builds a
Delivery and settles a Result. The only module of the library, with ``maintenance``, that
imports azure.functions (the ``functions`` extra)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import azure.functions as func
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from ..consumer import Handler, IdempotentConsumer
from ..errors import DedupError, InvalidMessage, StoreUnavailable
from ..jobs import CATCH_UP, complete, pending, run_job
from ..keys import joined_identity
from ..messages import Delivery, Effects, Outcome, Result, utcnow
from ..payload import parse_json
from ..reasons import PUBLIC, Reason
from ..steps import Context

log = logging.getLogger("idempotency")

# Service Bus bodies reach the function as the producer's bytes. With the default (string)
# the host also merges a JSON body's top-level fields into the trigger metadata, where a body
# field named "MessageId" would replace the broker's MessageId, the dedup key; a batch would
# be re-serialised, and a body that is not JSON would fail the whole batch before our code.
BODY_AS_BYTES = func.DataType.BINARY
REPLAYED = "Idempotent-Replayed"
RETRY_AFTER_SECONDS = "5"
MAX_REQUEST_BYTES = 256 * 1024  # as a Service Bus Standard message: larger bodies get 413 before parsing
MAX_IDEMPOTENCY_KEY = 255  # characters
# How long a delivery waits inside its invocation for a transient failure to clear, where the
# sender retries later by itself: Event Grid (with backoff; it must be answered within 30 s)
# and HTTP callers (told Retry-After). Service Bus redelivers at once: DEDUP_TRANSIENT_WAIT.
EVENT_GRID_WAIT = timedelta(seconds=5)
HTTP_WAIT = timedelta(seconds=2)
CLOUDEVENT_REQUIRED = ("id", "source", "specversion", "type")  # CloudEvents 1.0 required attributes


class RetryLater(DedupError):
    """Raised so that the host abandons the message (Service Bus) or retries the event
    (Event Grid): nothing was committed, or another delivery holds the claim."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.outcome.value}: {result.reason or ''} {result.key or ''}".strip())
        self.result = result


def acknowledge_or_retry(result: Result) -> None:
    """Service Bus (classic binding) and Event Grid: returning completes the message or
    accepts the event, raising abandons it or makes Event Grid retry with backoff.
    Refused messages (invalid, conflict) were recorded as dead letters by the consumer
    before this point, so accepting them loses nothing and stops useless retries."""
    if not result.acknowledge:
        raise RetryLater(result)


# -- Service Bus ---------------------------------------------------------------------------


def servicebus_delivery(msg: func.ServiceBusMessage) -> Delivery:
    """Only the producer's MessageId may become the key; delivery count and the rest
    go to logs and dead-letter records."""
    properties = dict(msg.application_properties or {})
    traceparent = properties.get("traceparent") or properties.get("Diagnostic-Id")
    return Delivery(
        body=msg.get_body(),
        message_id=msg.message_id or None,
        correlation_id=msg.correlation_id or None,
        delivery_count=msg.delivery_count,
        traceparent=str(traceparent) if traceparent else None,
        properties=properties,
    )


# -- Event Hubs (batch trigger) -----------------------------------------------------------------

# Where a producer's own id for an event may be: the AMQP message-id (EventData.message_id,
# among the system properties), an application property, or CloudEvents over AMQP (binary
# mode: source + id, with the "cloudEvents_" prefix the binding prefers or "cloudEvents:").
PRODUCER_IDS = ("message-id", "message_id", "messageId", "MessageId")
CLOUDEVENT_PREFIXES = ("cloudEvents_", "cloudEvents:")


def eventhub_deliveries(events: list[func.EventHubEvent]) -> list[Delivery]:
    """A batch's events, in partition order. The key: the producer's id when the event
    carries one (it also catches a producer's retry, a new event with a new sequence
    number), else the event's place in its hub (``event_position``), which catches replays
    from a checkpoint only. The host shares one metadata for the batch (``events[0].metadata``)."""
    metadata = (events[0].metadata or {}) if events else {}
    context = metadata.get("PartitionContext") or {}
    properties = metadata.get("PropertiesArray") or [{} for _ in events]
    system = metadata.get("SystemPropertiesArray") or [{} for _ in events]
    where = f"{context.get('EventHubName', '')}/{context.get('PartitionId', '')}"
    deliveries = []
    for event, props, sys_props in zip(events, properties, system, strict=True):
        props = dict(props or {})
        found = {**props, **dict(sys_props or {})}
        own = next((str(found[name]) for name in PRODUCER_IDS if found.get(name)), None)
        for prefix in CLOUDEVENT_PREFIXES:
            if own is None and props.get(prefix + "id") and props.get(prefix + "source"):
                own = joined_identity(str(props[prefix + "source"]), str(props[prefix + "id"]))
        traceparent = props.get("traceparent") or props.get("Diagnostic-Id")
        deliveries.append(Delivery(event.get_body(), message_id=own or event_position(where, event),
                                   traceparent=str(traceparent) if traceparent else None,
                                   properties=props))  # fmt: skip
    return deliveries


def event_position(where: str, event: func.EventHubEvent) -> str:
    """``<hub>/<partition>/<sequence number>@<enqueued time, UTC>``. Sequence numbers start
    again at 0 when a hub is re-created under the same name (or after a geo-DR failover): the
    enqueued time, which a replay from a checkpoint keeps, tells those events apart."""
    when = event.enqueued_time
    if when is None:  # the host always sends it; a hand-built event may not
        return f"{where}/{event.sequence_number}"
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return f"{where}/{event.sequence_number}@{when.isoformat(timespec='microseconds')}Z"


def on_eventhub_batch(consumer: Consumer, events: list[func.EventHubEvent], context: func.Context) -> None:
    """Process a batch (``cardinality="many"``). Event Hubs checkpoints the batch whether or
    not the function succeeded: raising only helps while the function's retry policy has
    retries left (it delays the checkpoint). On the last try, what still fails is parked —
    recorded with its reason for ``python -m shared.idempotency.replay`` — and the batch
    returns: a poison event never stops its partition (an invalid one is dead-lettered).

    Order: the handler sees the batch's events in partition order, but each event commits on
    its own (those that share a store partition together), and one retried after a transient
    failure commits after the events that followed it. A handler that needs order across
    events carries it in the data: ``LatestState`` with the event's version or sequence."""
    built = consumer()
    deliveries = eventhub_deliveries(events)
    failing = [(d, r) for d, r in zip(deliveries, built.process_batch(deliveries), strict=True) if not r.acknowledge]
    settle_or_park(built, failing, context)


def retries_left(context: Any) -> bool:
    """Whether the function's retry policy runs it again if it fails now (-1: without end)."""
    retry = getattr(context, "retry_context", None)
    return retry is not None and (retry.max_retry_count < 0 or retry.retry_count < retry.max_retry_count)


def settle_or_park(consumer: IdempotentConsumer, failing: list[tuple[Delivery, Result]], context: Any) -> None:
    """For a source that moves on whatever the function answers (an Event Hubs checkpoint, a
    timer's occurrence): raise while the function's retry policy has tries left (the host
    runs it again); on the last try park every failing message — all of them tried, even
    after one could not be recorded — then raise if one could not."""
    if not failing:
        return
    if retries_left(context):
        raise RetryLater(failing[0][1])
    unrecorded = [r for r in (consumer.park(d, r) for d, r in failing) if not r.acknowledge]
    if unrecorded:  # the store is down too: nothing more can be done here (docs/triggers.md)
        raise RetryLater(unrecorded[0])


# -- CloudEvents (Event Grid trigger, or plain HTTP) ---------------------------------------


def cloudevent_delivery(
    source: str | None,
    event_id: str | None,
    attributes: Mapping[str, Any],
    data: Any,
) -> Delivery:
    """Key = (source, id), the CloudEvents uniqueness rule; the payload that is validated
    and fingerprinted is the immutable part: type, subject and data. ``traceparent``,
    when present, is the correlation id."""
    envelope = {"type": attributes.get("type"), "subject": attributes.get("subject"), "data": data}
    return Delivery(
        body=json.dumps(envelope, separators=(",", ":"), default=str).encode(),
        message_id=joined_identity(source, event_id) if source and event_id else None,
        correlation_id=attributes.get("traceparent"),
        traceparent=attributes.get("traceparent"),
    )


def eventgrid_delivery(event: func.CloudEvent) -> Delivery:
    attributes = {**(event.extension_attrs or {}), "type": event.type, "subject": event.subject}
    return replace(cloudevent_delivery(event.source, event.id, attributes, event.get_json()), wait=EVENT_GRID_WAIT)


def http_cloudevent_delivery(req: func.HttpRequest) -> Delivery | str:
    """Structured or binary content mode, parsed by the CloudEvents SDK after checking the
    required attributes on the raw request (the SDK would invent a random id, and a 1.0
    specversion, for an event that has none); the reason, when it is not a valid event.
    The caller is part of the key: a caller can create or suppress only its own events,
    never an Event Grid delivery's nor another caller's."""
    structured = req.headers.get("Content-Type", "").startswith("application/cloudevents+json")
    try:
        attributes = parse_json(req.get_body()) if structured else None
    except InvalidMessage as exc:
        return f"the structured event is not valid JSON ({exc.reason})"

    def present(name: str) -> bool:
        value = attributes.get(name) if isinstance(attributes, dict) else req.headers.get(f"ce-{name}")
        return isinstance(value, str) and value != ""

    missing = [name for name in CLOUDEVENT_REQUIRED if not present(name)]
    if missing:
        return f"missing required CloudEvents attribute(s): {', '.join(missing)}"
    try:
        event = from_http_event(HTTPMessage(headers=dict(req.headers), body=req.get_body()))
    except Exception:  # noqa: BLE001 - the SDK raises several types for malformed events
        return "not a CloudEvents 1.0 event (structured or binary mode)"
    if event.get_specversion() != "1.0":
        return "specversion must be 1.0"
    envelope = {**event.get_attributes(), "type": event.get_type(), "subject": event.get_subject()}
    delivery = cloudevent_delivery(event.get_source(), event.get_id(), envelope, event.get_data())
    caller = caller_identity(req)
    return replace(delivery, message_id=joined_identity(caller, delivery.message_id or ""), origin=caller,
                   wait=HTTP_WAIT)  # fmt: skip


def webhook_handshake(req: func.HttpRequest) -> func.HttpResponse:
    """CloudEvents webhook validation (abuse protection): echo the requesting origin."""
    origin = req.headers.get("WebHook-Request-Origin")
    if not origin:
        return problem(400, "missing WebHook-Request-Origin", "this endpoint answers the CloudEvents handshake")
    headers = {"WebHook-Allowed-Origin": origin, "WebHook-Allowed-Rate": "*", "Allow": "POST"}
    return func.HttpResponse(status_code=200, headers=headers)


def cloudevent_response(result: Result) -> func.HttpResponse:
    """204: accepted, no content (CloudEvents HTTP webhook)."""
    if result.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE):
        return func.HttpResponse(
            status_code=204, headers={REPLAYED: "true"} if result.outcome is Outcome.DUPLICATE else {}
        )
    return refusal(result)


# -- HTTP with Idempotency-Key -------------------------------------------------------------


def caller_identity(req: func.HttpRequest) -> str:
    """Who is calling, so that one client never sees another's stored responses.
    The Easy Auth principal (trusted only when Easy Auth is on: the platform then strips
    any such header sent by a client), else the function key used (hashed, never
    stored), else ``anonymous`` — only possible with auth level ANONYMOUS or locally."""
    principal: str | None = req.headers.get("x-ms-client-principal-id")
    if principal and os.environ.get("WEBSITE_AUTH_ENABLED", "").lower() == "true":
        return "principal:" + principal
    key = req.headers.get("x-functions-key") or req.params.get("code")
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return "anonymous"


def http_delivery(req: func.HttpRequest) -> Delivery | func.HttpResponse:
    """A JSON request with its Idempotency-Key, or the problem response that refuses it.
    The consumer keys it by the business key in the body (one order per orderId, whatever
    the Idempotency-Key); the caller is its origin, so a caller's retry under a new key
    replays its own response, and nobody else's request matches it."""
    key = req.headers.get("Idempotency-Key")
    if not key:
        return problem(400, "Idempotency-Key header required", "send a unique key per logical request")
    if len(key) > MAX_IDEMPOTENCY_KEY:
        return problem(400, "Idempotency-Key too long", f"at most {MAX_IDEMPOTENCY_KEY} characters")
    if not req.headers.get("Content-Type", "").startswith("application/json"):
        return problem(415, "Unsupported media type", "send Content-Type: application/json")
    caller, traceparent = caller_identity(req), req.headers.get("traceparent")
    return Delivery(body=req.get_body(), message_id=joined_identity(caller, key), correlation_id=traceparent,
                    traceparent=traceparent, origin=caller, wait=HTTP_WAIT)  # fmt: skip


def too_large(req: func.HttpRequest) -> func.HttpResponse | None:
    """413 before anything parses the body."""
    declared = req.headers.get("Content-Length", "")
    size = int(declared) if declared.isdigit() else len(req.get_body())
    if size > MAX_REQUEST_BYTES:
        return problem(413, "Request too large", f"bodies are limited to {MAX_REQUEST_BYTES} bytes")
    return None


def stored_response(handler: Handler, status: int, location: str) -> Handler:
    """Store the HTTP response (status, body, headers) as the result, so a repeat
    replays exactly what the first request answered. ``location``: a format string
    applied to the handler's result, each value percent-encoded (a header holds ASCII
    without line breaks, whatever the ids hold)."""

    def handle(payload: Any, context: Context) -> Effects:
        effects = handler(payload, context)
        assert isinstance(effects, Effects), "an HTTP response is stored with a marker"
        safe = {name: quote(str(value), safe="") for name, value in effects.result.items()}
        headers = {"Location": location.format(**safe)}
        return replace(effects, result={"status": status, "body": effects.result, "headers": headers})

    return handle


def http_response(result: Result) -> func.HttpResponse:
    if result.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE) and isinstance(result.response, dict):
        headers = dict(result.response.get("headers") or {})
        if result.outcome is Outcome.DUPLICATE:
            headers[REPLAYED] = "true"
        return func.HttpResponse(json.dumps(result.response["body"]), status_code=int(result.response["status"]),
                                 headers=headers, mimetype="application/json")  # fmt: skip
    if result.outcome is Outcome.DUPLICATE:  # processed long ago: its stored response has expired
        return problem(409, "Already processed", "this request was processed; its stored response has expired")
    return refusal(result)


def refusal(result: Result) -> func.HttpResponse:
    if result.outcome is Outcome.CONFLICT:
        return problem(409, "Conflict with an earlier request",
                       "this business key was already used by another request or another caller")  # fmt: skip
    if result.outcome is Outcome.IN_FLIGHT:
        return problem(409, "A request with this key is in progress", "retry later", retry_after=True)
    if (
        result.outcome is Outcome.INVALID and result.reason == Reason.IDEMPOTENCY_KEY_REUSED
    ):  # IETF Idempotency-Key draft
        return problem(422, "Idempotency-Key reused", "this Idempotency-Key was already sent with another payload")
    if result.outcome is Outcome.INVALID:
        detail = (result.detail or "")[:500] if result.reason in PUBLIC else "the request was refused"
        return problem(400, f"Invalid request: {result.reason}", detail)
    return unavailable()


def ready(consumer: Callable[[], IdempotentConsumer]) -> IdempotentConsumer | func.HttpResponse:
    """A cold instance whose store is unreachable answers as a warm one does: 503 + Retry-After."""
    try:
        return consumer()
    except StoreUnavailable:
        return unavailable()


def unavailable() -> func.HttpResponse:
    return problem(503, "Temporarily unavailable", "retry later", retry_after=True)


def problem(status: int, title: str, detail: str, *, retry_after: bool = False) -> func.HttpResponse:
    """RFC 9457 problem details."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if retry_after else {}
    return func.HttpResponse(json.dumps(body), status_code=status, headers=headers,
                             mimetype="application/problem+json")  # fmt: skip


# -- one call per trigger: a function's whole body ------------------------------------------

Consumer = Callable[[], IdempotentConsumer]  # a consumer declared with @consumer


def on_servicebus(consumer: Consumer, msg: func.ServiceBusMessage) -> None:
    """Process one Service Bus message: returning completes it, raising abandons it."""
    acknowledge_or_retry(consumer().process(servicebus_delivery(msg)))


def on_servicebus_batch(consumer: Consumer, messages: list[func.ServiceBusMessage]) -> None:
    """Process a batch (``cardinality="many"``). With the classic binding a batch completes or
    is abandoned as a whole: one message to retry brings the batch back, and its committed
    messages are then cheap duplicates."""
    for result in consumer().process_batch([servicebus_delivery(m) for m in messages]):
        acknowledge_or_retry(result)


def on_schedule(consumer: Consumer, every: timedelta, at: timedelta,
                items: Callable[[datetime], Iterable[tuple[str, Any]]], context: Any = None, *,
                catch_up: int = CATCH_UP) -> None:  # fmt: skip
    """Run a timer's occurrence: each (id, item) that ``items(occurrence)`` returns, once per
    occurrence (``shared.idempotency.jobs``), after the occurrences since the last completed
    one that no run finished (at most ``catch_up``). An item still failing raises while the
    timer's retry policy has tries left (the occurrences run again; what was done is not done
    twice); on the last try it is parked for ``python -m shared.idempotency.replay``, and the
    occurrence counts as completed. A run that cannot even park leaves it to the next run."""
    built = consumer()
    due = pending(built, utcnow(), every, at, catch_up=catch_up)
    runs, unlisted = [], []
    for when in due:
        try:
            listed = list(items(when))
        except Exception:  # one occurrence's items never stop the others'
            log.exception("dedup job %s: the items of %s could not be listed", built.name, when)
            unlisted.append(when)
            continue
        runs.append(run_job(built, when, listed))
    settle_or_park(built, [(d, r) for run in runs for d, r in zip(run.deliveries, run.results, strict=True)
                           if not r.acknowledge], context)  # fmt: skip
    if unlisted and retries_left(context):
        raise RetryLater(Result(Outcome.TRANSIENT, None, Reason.ITEMS_FAILED, f"{len(unlisted)} occurrence(s)"))
    done = [when for when in due if when < min(unlisted, default=due[-1] + every)]  # the next run tries the rest
    if done:
        complete(built, done[-1])


def on_eventgrid(consumer: Consumer, event: func.CloudEvent) -> None:
    """Process one Event Grid CloudEvent: returning accepts it, raising makes Event Grid retry."""
    acknowledge_or_retry(consumer().process(eventgrid_delivery(event)))


def on_http(consumer: Consumer, req: func.HttpRequest) -> func.HttpResponse:
    """A JSON POST with ``Idempotency-Key``: refused (413, 400, 415) before parsing when it
    must be, 503 when a cold instance cannot reach its store, else the stored response."""
    delivery = too_large(req) or http_delivery(req)
    if isinstance(delivery, func.HttpResponse):
        return delivery
    found = ready(consumer)
    return found if isinstance(found, func.HttpResponse) else http_response(found.process(delivery))


def on_cloudevents_http(consumer: Consumer, req: func.HttpRequest) -> func.HttpResponse:
    """A CloudEvents webhook: the OPTIONS handshake, then one event per POST (204)."""
    if req.method == "OPTIONS":
        return webhook_handshake(req)
    refused = too_large(req)
    if refused is not None:
        return refused
    delivery = http_cloudevent_delivery(req)
    if isinstance(delivery, str):
        return problem(400, "Not a valid CloudEvent", delivery)
    found = ready(consumer)
    return found if isinstance(found, func.HttpResponse) else cloudevent_response(found.process(delivery))
