"""The stream example: shipment tracking events from Event Hubs, one tracking record per
event, however often a replay from a checkpoint or a producer's retry brings it again."""

from __future__ import annotations

from typing import Any

from shared.idempotency import Context, Effects, Entity

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["shipmentId", "orderId", "status"],
    "properties": {"shipmentId": {"type": "string"}, "orderId": {"type": "string"}, "status": {"type": "string"}},
}


def tracking_handler(event: dict[str, Any], context: Context) -> Effects:
    return Effects([Entity("tracking", {**event, "eventKey": context.key.id})], {"status": event["status"]})
