"""Recipe ``cloudevents-http``: shipments as CloudEvents from ``POST /api/events`` (the
CloudEvents webhook: the OPTIONS handshake, then one event per POST), under the Event Grid
consumer's name and markers, with its handler and schema (consumers/order_events.py). An event
sent over HTTP is keyed by its caller too, so no caller can pre-claim, or replay, an event that
Event Grid delivers; refusals are told to the caller."""

from __future__ import annotations

import azure.functions as func

from consumers.order_events import EVENTS_CONSUMER, SHIPPED_SCHEMA, shipment_handler
from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import consumer, on_cloudevents_http, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def api_consumer() -> IdempotentConsumer:
    return IdempotentConsumer(EVENTS_CONSUMER, shared_store(), shipment_handler, schema=SHIPPED_SCHEMA,
                              record_refusals=False)  # fmt: skip


@bp.function_name("events_api")
@bp.route(route="events", methods=["POST", "OPTIONS"], auth_level=func.AuthLevel.FUNCTION)
def events_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_cloudevents_http(api_consumer, req)
