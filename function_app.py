"""Azure Functions entry points (Python v2 programming model). Each function is thin:
binding → dedup module → settlement. The flow lives in shared/idempotency."""

from __future__ import annotations

import functools

import azure.functions as func

from shared.bindings import servicebus_delivery, settle_servicebus
from shared.idempotency import IdempotentConsumer
from shared.idempotency.settings import retention, setting, table_service
from shared.idempotency.table_store import TableStore
from shared.orders import SCHEMA, order_effects

app = func.FunctionApp()


@functools.cache
def order_consumer() -> IdempotentConsumer:
    """Built on first use from app settings (see README, Configuration)."""
    store = TableStore(
        table_service(),
        table=setting("ORDERS_TABLE", "orders"),
        dead_letter_table=setting("DEDUP_DEADLETTER_TABLE", "deadletters"),
    )
    store.create_tables()
    return IdempotentConsumer(
        setting("ORDERS_CONSUMER_NAME", "orders"),
        store,
        order_effects,
        schema=SCHEMA,
        retention=retention(),
    )


@app.function_name("orders")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="ServiceBusConnection")
def orders(msg: func.ServiceBusMessage) -> None:
    settle_servicebus(order_consumer().process(servicebus_delivery(msg)))
