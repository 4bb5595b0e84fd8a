"""Orders from a Service Bus queue: one order record and one ledger posting per order, in
one transaction with the dedup marker. Two features switch on by their setting (and infra's
recipe of the same name): ``payments`` charges through the payment API as a two-phase step
first (PAYMENT_API_URL); ``outbox`` publishes ``OrderAccepted`` to ORDER_ACCEPTED_TOPIC."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_sender, shared_store
from shared.orders import SCHEMA, accepted_topic, housekeeping, order_handler, payments

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
HOUSEKEEPING = housekeeping()


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
