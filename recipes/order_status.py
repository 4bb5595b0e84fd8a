"""Event-carried state, in order: each message holds an order's whole status and its version;
the store keeps the newest (a versioned upsert: a redelivery is ``duplicate``, an older
version ``stale``), so no marker is needed. The queue is session-enabled, a session per
order (producers set SessionId = orderId): one receiver per order at a time, in order, so
no version is skipped as stale on its way (docs/triggers.md)."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import IdempotentConsumer, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_store
from shared.orders import STATUS_SCHEMA, status_handler

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def status_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("order-status", shared_store(), status_handler, schema=STATUS_SCHEMA,
                              key_source=from_body_field("orderId"))  # fmt: skip


@bp.function_name("order_status")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDER_STATUS_QUEUE%", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES, is_sessions_enabled=True)  # fmt: skip
def order_status(msg: func.ServiceBusMessage) -> None:
    on_servicebus(status_consumer, msg)
