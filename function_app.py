"""Azure Functions entry points (Python v2 programming model). Each function is thin:
binding → dedup module → settlement. The flow lives in shared/idempotency."""

from __future__ import annotations

import functools
import os

import azure.functions as func

from shared.bindings import servicebus_delivery, settle_servicebus
from shared.idempotency import IdempotentConsumer
from shared.idempotency.downstream import IdempotentHttp
from shared.idempotency.reconcile import escalate_stale_claims
from shared.idempotency.settings import duration, open_store, retention, setting, step_policy
from shared.orders import SCHEMA, order_handler

app = func.FunctionApp()


@functools.cache
def order_consumer() -> IdempotentConsumer:
    """Built on first use from app settings (see README, Configuration)."""
    store = open_store(setting("ORDERS_TABLE", "orders"), setting("DEDUP_DEADLETTER_TABLE", "deadletters"))
    payment_api = os.environ.get("PAYMENT_API_URL")
    return IdempotentConsumer(
        setting("ORDERS_CONSUMER_NAME", "orders"),
        store,
        order_handler(IdempotentHttp(payment_api) if payment_api else None),
        schema=SCHEMA,
        retention=retention(),
        steps=step_policy(),
    )


@app.function_name("orders")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="ServiceBusConnection")
def orders(msg: func.ServiceBusMessage) -> None:
    settle_servicebus(order_consumer().process(servicebus_delivery(msg)))


@app.function_name("reconcile_claims")
@app.timer_trigger(arg_name="timer", schedule="0 */15 * * * *", use_monitor=True)
def reconcile_claims(timer: func.TimerRequest) -> None:
    """Escalates two-phase claims whose lease expired more than DEDUP_STALE_AFTER ago."""
    escalate_stale_claims(order_consumer().store, duration("DEDUP_STALE_AFTER", "PT1H"))
