"""CloudEvents over plain HTTP (a webhook, structured or binary mode): ``on_cloudevents_http``."""

from __future__ import annotations

from dataclasses import replace

import azure.functions as func
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from ..errors import InvalidMessage
from ..keys import joined_identity
from ..messages import Delivery, Outcome, Result
from ..payload import parse_json
from ..reasons import Reason
from ._eventgrid import cloudevent_delivery
from ._http import HTTP_WAIT, REPLAYED, caller_identity, problem, ready, refusal, too_large
from ._settle import Consumer

CLOUDEVENT_REQUIRED = ("id", "source", "specversion", "type")  # CloudEvents 1.0 required attributes


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
    """204: accepted, no content (CloudEvents HTTP webhook), a declined event too (handled, as on
    Event Grid); an event id its caller sent before with another payload, 409."""
    if result.outcome in (Outcome.PROCESSED, Outcome.DECLINED, Outcome.DUPLICATE):
        return func.HttpResponse(
            status_code=204, headers={REPLAYED: "true"} if result.outcome is Outcome.DUPLICATE else {}
        )
    if result.outcome is Outcome.INVALID and result.reason == Reason.IDEMPOTENCY_KEY_REUSED:  # the event's id, reused
        return problem(
            409, "Conflict with an earlier event", "this source and id were sent before with another payload"
        )
    return refusal(result)
