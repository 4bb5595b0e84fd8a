"""Shipments as CloudEvents from Event Grid: one shipment record per event, keyed by the
CloudEvents uniqueness rule (source, id)."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import consumer, on_eventgrid, shared_store
from shared.orders import EVENTS_CONSUMER, SHIPPED_SCHEMA, shipment_handler

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def grid_consumer() -> IdempotentConsumer:
    return IdempotentConsumer(EVENTS_CONSUMER, shared_store(), shipment_handler, schema=SHIPPED_SCHEMA)


@bp.function_name("order_events")
@bp.event_grid_trigger(arg_name="event")
def order_events(event: func.CloudEvent) -> None:
    on_eventgrid(grid_consumer, event)
