"""Publish/subscribe: billing and shipping each receive every order from the topic and
keep their own markers (their names scope their keys), so neither blocks the other. Keyed
by the order's id, the business key: an order published by the orders consumer's outbox
(a MessageId of its own) and one sent by a producer (MessageId = orderId) are one order."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import IdempotentConsumer, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_store
from shared.orders import SCHEMA, invoice_handler, picklist_handler

BY_ORDER = from_body_field("orderId")
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


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
