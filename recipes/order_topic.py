"""Publish/subscribe: billing and shipping each receive every order from the topic and
keep their own markers (their names scope their keys), so neither blocks the other. Keyed
by the order's id, the business key: an order published by the orders consumer's outbox
(a MessageId of its own) and one sent by a producer (MessageId = orderId) are one order,
validated by the orders consumer's schema (consumers/orders.py)."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from consumers.orders import SCHEMA
from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, InvalidMessage, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_store

BY_ORDER = from_body_field("orderId")
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


def _same_order(order: dict[str, Any], context: Context) -> None:
    if order["orderId"] != context.key.id:
        raise InvalidMessage("key_mismatch", "the message's key is not its orderId")


def invoice_handler(order: dict[str, Any], context: Context) -> Effects:
    """Billing's own effect of an order: one invoice."""
    _same_order(order, context)
    invoice = {"orderId": order["orderId"], "customerId": order["customerId"], "amount": float(order["amount"]),
               "currency": order["currency"]}  # fmt: skip
    return Effects([Entity("invoice", invoice)], {"invoiced": invoice["amount"]})


def picklist_handler(order: dict[str, Any], context: Context) -> Effects:
    """Shipping's own effect of the same order: one pick list."""
    _same_order(order, context)
    lines = [f"{item['quantity']} x {item['sku']}" for item in order["items"]]
    return Effects([Entity("picklist", {"orderId": order["orderId"], "lines": lines})], {"lines": len(lines)})


@consumer
def billing_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("billing", shared_store(), invoice_handler, schema=SCHEMA, key_source=BY_ORDER)


@consumer
def shipping_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("shipping", shared_store(), picklist_handler, schema=SCHEMA, key_source=BY_ORDER)


@bp.function_name("billing")
@bp.service_bus_topic_trigger(arg_name="msg", topic_name="%ORDER_TOPIC%", subscription_name="%BILLING_SUBSCRIPTION%",
                              connection="ServiceBusConnection", data_type=BODY_AS_BYTES)  # fmt: skip
def billing(msg: func.ServiceBusMessage) -> None:
    on_servicebus(billing_consumer, msg)


@bp.function_name("shipping")
@bp.service_bus_topic_trigger(arg_name="msg", topic_name="%ORDER_TOPIC%", subscription_name="%SHIPPING_SUBSCRIPTION%",
                              connection="ServiceBusConnection", data_type=BODY_AS_BYTES)  # fmt: skip
def shipping(msg: func.ServiceBusMessage) -> None:
    on_servicebus(shipping_consumer, msg)
