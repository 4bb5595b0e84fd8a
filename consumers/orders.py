"""Orders, from a Service Bus queue and from ``POST /api/orders``: one order record and one
ledger posting per order, the charge through the payment API when one is configured, and
``OrderAccepted`` published to ORDER_ACCEPTED_TOPIC when it is set (the outbox)."""

from __future__ import annotations

import os

import azure.functions as func

from shared.idempotency import IdempotentConsumer, IdempotentHttp, from_body_field
from shared.idempotency.functions import (
    BODY_AS_BYTES,
    consumer,
    on_http,
    on_servicebus,
    shared_sender,
    shared_store,
    stored_response,
)
from shared.orders import SCHEMA, order_handler

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


def payments() -> IdempotentHttp | None:
    url = os.environ.get("PAYMENT_API_URL")
    return IdempotentHttp(url) if url else None


def accepted_topic() -> str | None:
    return os.environ.get("ORDER_ACCEPTED_TOPIC") or None


@consumer
def queue_consumer() -> IdempotentConsumer:
    topic = accepted_topic()
    handler = order_handler(payments(), accepted_topic=topic)
    return IdempotentConsumer("orders", shared_store(), handler, schema=SCHEMA,
                              sender=shared_sender() if topic else None)  # fmt: skip


@consumer
def api_consumer() -> IdempotentConsumer:
    """Keyed by the business key: one order per orderId, whatever the Idempotency-Key; a
    duplicate answers with the stored response, refusals are told to the caller; an
    Idempotency-Key reused with another payload is refused (422)."""
    topic = accepted_topic()
    handler = stored_response(order_handler(payments(), accepted_topic=topic), 201, "/api/orders/{orderId}")
    by_order = from_body_field("orderId")
    return IdempotentConsumer("orders-api", shared_store(), handler, schema=SCHEMA, key_source=by_order,
                              replay_results=True, record_refusals=False, bind_request_keys=True,
                              sender=shared_sender() if topic else None)  # fmt: skip


@bp.function_name("orders")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def orders(msg: func.ServiceBusMessage) -> None:
    on_servicebus(queue_consumer, msg)


@bp.function_name("orders_api")
@bp.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def orders_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_http(api_consumer, req)
