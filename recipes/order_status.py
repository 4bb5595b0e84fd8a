"""Event-carried state, in order: each message holds an order's whole status and its version;
the store keeps the newest (a versioned upsert: a redelivery is ``duplicate``, an older
version ``stale``), so no marker is needed. The queue is session-enabled, a session per
order (producers set SessionId = orderId): one receiver per order at a time, in order, so
no version is skipped as stale on its way (docs/triggers.md)."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.idempotency import Context, Entity, IdempotentConsumer, LatestState, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/schemas/order-status-changed.json",
    "title": "OrderStatusChanged",
    "type": "object",
    "additionalProperties": False,
    "required": ["orderId", "status", "version"],
    "properties": {
        "orderId": {"type": "string", "minLength": 1, "maxLength": 128},
        "status": {"enum": ["placed", "paid", "packed", "shipped", "delivered", "cancelled"]},
        "version": {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
    },
}


def status_handler(change: dict[str, Any], context: Context) -> LatestState:
    """``OrderStatusChanged {orderId, status, version}`` carries the absolute status: it
    is applied as an upsert when its version is newer, ignored (``stale``) otherwise."""
    state = {"orderId": change["orderId"], "status": change["status"]}
    return LatestState(Entity("status", state), int(change["version"]), {"status": change["status"]})


@consumer
def status_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("order-status", shared_store(), status_handler, schema=SCHEMA,
                              key_source=from_body_field("orderId"))  # fmt: skip


@bp.function_name("order_status")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDER_STATUS_QUEUE%", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES, is_sessions_enabled=True)  # fmt: skip
def order_status(msg: func.ServiceBusMessage) -> None:
    on_servicebus(status_consumer, msg)
