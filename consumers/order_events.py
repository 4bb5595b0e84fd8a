"""Shipments as CloudEvents, from Event Grid and from ``POST /api/events``, under one
consumer name. An event is keyed by (source, id); one sent over HTTP also by its caller, so
no caller can pre-claim, or replay, an event that Event Grid delivers."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import consumer, on_cloudevents_http, on_eventgrid, shared_store
from shared.orders import SHIPPED_SCHEMA, shipment_handler

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
NAME = "order-events"


@consumer
def grid_consumer() -> IdempotentConsumer:
    return IdempotentConsumer(NAME, shared_store(), shipment_handler, schema=SHIPPED_SCHEMA)


@consumer
def api_consumer() -> IdempotentConsumer:
    """The same markers; refusals are told to the HTTP caller instead of recorded."""
    return IdempotentConsumer(NAME, shared_store(), shipment_handler, schema=SHIPPED_SCHEMA, record_refusals=False)


@bp.function_name("order_events")
@bp.event_grid_trigger(arg_name="event")
def order_events(event: func.CloudEvent) -> None:
    on_eventgrid(grid_consumer, event)


@bp.function_name("events_api")
@bp.route(route="events", methods=["POST", "OPTIONS"], auth_level=func.AuthLevel.FUNCTION)
def events_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_cloudevents_http(api_consumer, req)
