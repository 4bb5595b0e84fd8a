"""Shipments as CloudEvents from Event Grid: one shipment record per event, keyed by the
CloudEvents uniqueness rule (source, id). The recipe ``cloudevents-http`` (events_api.py)
takes the same events over HTTP under this consumer's name, handler and schema."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer
from shared.idempotency.functions import consumer, on_eventgrid, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

EVENTS_CONSUMER = "order-events"  # the shipment events' consumer, from Event Grid and (recipe) over HTTP
SHIPPED = "com.example.order.shipped"  # the CloudEvents type of a shipment
SHIPPED_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/schemas/order-shipped-event.json",
    "title": "OrderShipped CloudEvent (type, subject and data: the fingerprinted part)",
    "type": "object",
    "required": ["type", "data"],
    "properties": {
        "type": {"const": SHIPPED},
        "subject": {"type": ["string", "null"], "maxLength": 512},
        "data": {
            "type": "object",
            "additionalProperties": False,
            "required": ["orderId", "carrier", "trackingNumber"],
            "properties": {
                "orderId": {"type": "string", "minLength": 1, "maxLength": 128},
                "carrier": {"type": "string", "minLength": 1, "maxLength": 64},
                "trackingNumber": {"type": "string", "minLength": 1, "maxLength": 128},
            },
        },
    },
}


def shipment_handler(event: dict[str, Any], context: Context) -> Effects:
    """An ``com.example.order.shipped`` CloudEvent records one shipment."""
    shipped = event["data"]
    record = {"orderId": shipped["orderId"], "carrier": shipped["carrier"], "trackingNumber": shipped["trackingNumber"]}
    return Effects(entities=[Entity("shipment", record)], result={"orderId": shipped["orderId"], "shipped": True})


@consumer
def grid_consumer() -> IdempotentConsumer:
    return IdempotentConsumer(EVENTS_CONSUMER, shared_store(), shipment_handler, schema=SHIPPED_SCHEMA)


@bp.function_name("order_events")
@bp.event_grid_trigger(arg_name="event")
def order_events(event: func.CloudEvent) -> None:
    on_eventgrid(grid_consumer, event)
