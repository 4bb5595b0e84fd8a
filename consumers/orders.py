"""Orders from a Service Bus queue: one order record and one ledger posting per order, in
one transaction with the dedup marker. Two features switch on by their setting (and infra's
recipe of the same name): ``payments`` charges through the payment API as a two-phase step
first (PAYMENT_API_URL); ``outbox`` publishes ``OrderAccepted`` to ORDER_ACCEPTED_TOPIC.

The ledger is append-only, as ledgers are: each posting is a new entity. Nothing in the
data itself stops a second posting for the same order; the dedup marker committed in the
same transaction is what does — the pattern's reason to exist. The recipes ``http``
(orders_api.py) and ``topic`` (order_topic.py) take this module's order handler and schema."""

from __future__ import annotations

import os
import uuid
from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, IdempotentHttp, InvalidMessage, Outgoing
from shared.idempotency.consumer import Handler
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_sender, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/schemas/order.json",
    "title": "Order",
    "type": "object",
    "additionalProperties": False,
    "required": ["orderId", "customerId", "amount", "currency", "items"],
    "properties": {
        "orderId": {"type": "string", "minLength": 1, "maxLength": 128},
        "customerId": {"type": "string", "minLength": 1, "maxLength": 128},
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["sku", "quantity"],
                "properties": {
                    "sku": {"type": "string", "minLength": 1, "maxLength": 64},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 10000},
                },
            },
        },
    },
}

ORDER = "order"
CHARGE_PREFIX = "charge|"


def payments() -> IdempotentHttp | None:
    """The payment API the orders charge through, when PAYMENT_API_URL is set (recipe ``payments``)."""
    url = os.environ.get("PAYMENT_API_URL")
    return IdempotentHttp(url) if url else None


def accepted_topic() -> str | None:
    """Where the orders publish ``OrderAccepted`` (recipe ``outbox``), when ORDER_ACCEPTED_TOPIC is set."""
    return os.environ.get("ORDER_ACCEPTED_TOPIC") or None


def needs() -> set[str]:
    """What the orders consumers need of the store's housekeeping, by the features switched on:
    reconcile_claims for the payment step ("steps"), dispatch_outbox for the outbox ("outbox")."""
    return {name for name, on in (("steps", payments()), ("outbox", accepted_topic())) if on}


NEEDS = needs()


def order_handler(payments: IdempotentHttp | None = None, *, key_is_order_id: bool = True,
                  accepted_topic: str | None = None) -> Handler:  # fmt: skip
    """Without ``payments`` the handler does no I/O: one transaction commits the order,
    its ledger posting and the marker. With it, the charge goes through the payment API
    (step ``charge``) and the posting records the payment's charge id. With
    ``accepted_topic``, the order is published there as ``OrderAccepted`` (the outbox:
    committed with the order, sent after it, for billing and shipping).
    ``key_is_order_id``: the queue's producer sets MessageId = orderId, so they must agree
    (an HTTP caller's Idempotency-Key is its own)."""

    def handle(order: dict[str, Any], context: Context) -> Effects:
        if key_is_order_id and order["orderId"] != context.key.id:
            raise InvalidMessage("key_mismatch", "the message's key is not its orderId")
        charge = {
            "orderId": order["orderId"],
            "customerId": order["customerId"],
            "amount": float(order["amount"]),
            "currency": order["currency"],
        }
        posting_id = uuid.uuid4().hex
        if payments is not None:
            accepted = context.step("charge", lambda key: payments.post("/charges", charge, key))
            posting_id = str(accepted["id"])
        return Effects(
            entities=[
                Entity(ORDER, {**charge, "items": order["items"]}),
                Entity(CHARGE_PREFIX + posting_id, charge),
            ],
            result={"orderId": order["orderId"], "charged": charge["amount"], "currency": order["currency"]},
            messages=[Outgoing(accepted_topic, order, "accepted", {"type": "OrderAccepted"})] if accepted_topic else [],
        )

    return handle


@consumer
def queue_consumer() -> IdempotentConsumer:
    topic = accepted_topic()
    return IdempotentConsumer("orders", shared_store(), order_handler(payments(), accepted_topic=topic), schema=SCHEMA,
                              sender=shared_sender() if topic else None)  # fmt: skip


@bp.function_name("orders")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def orders(msg: func.ServiceBusMessage) -> None:
    on_servicebus(queue_consumer, msg)
