"""Recipe ``http``: orders from ``POST /api/orders`` with an ``Idempotency-Key`` — the same
order handler and schema as the queue (consumers/orders.py), keyed by the business key (one
order per orderId, whatever the Idempotency-Key); a duplicate answers with the stored response,
refusals are told to the caller, an Idempotency-Key reused with another payload is refused (422)."""

from __future__ import annotations

import azure.functions as func

from consumers.orders import SCHEMA, accepted_topic, needs, order_handler, payments
from shared.idempotency import IdempotentConsumer, from_body_field
from shared.idempotency.functions import consumer, on_http, shared_sender, shared_store, stored_response

BY_ORDER = from_body_field("orderId")
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
NEEDS = needs()


@consumer
def api_consumer() -> IdempotentConsumer:
    topic = accepted_topic()
    handler = stored_response(order_handler(payments(), accepted_topic=topic), 201, "/api/orders/{orderId}")
    return IdempotentConsumer("orders-api", shared_store(), handler, schema=SCHEMA, key_source=BY_ORDER,
                              replay_results=True, record_refusals=False, bind_request_keys=True,
                              sender=shared_sender() if topic else None)  # fmt: skip


@bp.function_name("orders_api")
@bp.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def orders_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_http(api_consumer, req)
