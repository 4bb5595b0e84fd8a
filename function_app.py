"""Azure Functions entry points (Python v2 programming model). Each function is thin:
binding → dedup module → settlement. The flow lives in shared/idempotency."""

from __future__ import annotations

import functools
import logging
import os
import typing
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

import azure.functions as func

from shared import ledger
from shared.bindings import (
    acknowledge_or_retry,
    cloudevent_response,
    eventgrid_delivery,
    http_cloudevent_delivery,
    http_delivery,
    http_response,
    problem,
    servicebus_delivery,
    stored_response,
    too_large,
    unavailable,
    webhook_handshake,
)
from shared.idempotency import (
    DedupKey,
    Handler,
    IdempotentConsumer,
    StoreUnavailable,
    from_body_field,
    from_message_id,
)
from shared.idempotency.downstream import IdempotentHttp
from shared.idempotency.keys import KeySource
from shared.idempotency.reconcile import escalate_stale_claims
from shared.idempotency.records import utcnow
from shared.idempotency.settings import DedupConfig, app_store, duration, setting
from shared.orders import (
    SCHEMA,
    SHIPPED_SCHEMA,
    STATUS_SCHEMA,
    invoice_handler,
    order_handler,
    picklist_handler,
    shipment_handler,
    status_handler,
)

app = func.FunctionApp()

# Service Bus bodies reach the function as the producer's bytes. With the default (string)
# the host also merges a JSON body's top-level fields into the trigger metadata, where a body
# field named "MessageId" would replace the broker's MessageId, the dedup key; a batch would
# be re-serialised, and a body that is not JSON would fail the whole batch before our code.
BODY_AS_BYTES = func.DataType.BINARY
# The worker logs at INFO: keep the SDKs' per-request HTTP logging out of the app's logs.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

if os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):  # on Azure: metrics, traces and logs to App Insights
    from azure.identity import DefaultAzureCredential
    from azure.monitor.opentelemetry import configure_azure_monitor

    configure_azure_monitor(credential=DefaultAzureCredential())  # Entra ID ingestion: local auth is off


@dataclass(frozen=True)
class Consumers:
    orders: IdempotentConsumer  # Service Bus queue
    orders_api: IdempotentConsumer  # POST /api/orders with Idempotency-Key
    order_events: IdempotentConsumer  # Event Grid (CloudEvents)
    order_events_api: IdempotentConsumer  # POST /api/events: the same consumer, refusals told to the caller
    billing: IdempotentConsumer  # topic subscriber 1
    shipping: IdempotentConsumer  # topic subscriber 2: same messages, its own markers
    order_status: IdempotentConsumer  # event-carried state: versioned upserts, no marker
    ledger: IdempotentConsumer  # batch trigger: postings committed per account, many per request


@functools.cache
def consumers() -> Consumers:
    """Built on first use from app settings (README, Configuration). The consumers share
    one store; their names scope their keys, so none ever blocks another."""
    store = app_store()
    payment_api = os.environ.get("PAYMENT_API_URL")
    payments = IdempotentHttp(payment_api) if payment_api else None
    config = DedupConfig.from_settings()

    def consumer(
        name: str,
        handler: Handler,
        schema: dict[str, Any],
        *,
        http: bool = False,
        replay: bool = False,
        key: KeySource = from_message_id,
        partition: Callable[[DedupKey], str] = lambda key: key.id,
    ) -> IdempotentConsumer:
        # An HTTP route tells its caller of refusals instead of recording them; ``replay``:
        # a duplicate answers with the stored response (one more read, duplicates only).
        return IdempotentConsumer(name, store, handler, schema=schema, config=config, key_source=key,
                                  replay_results=replay, record_refusals=not http, partition_for=partition)  # fmt: skip

    return Consumers(
        orders=consumer(setting("ORDERS_CONSUMER_NAME", "orders"), order_handler(payments), SCHEMA),
        orders_api=consumer(  # keyed by the business key: one order per orderId, whatever Idempotency-Key
            setting("ORDERS_API_CONSUMER_NAME", "orders-api"),
            stored_response(order_handler(payments), 201, "/api/orders/{orderId}"),
            SCHEMA,
            http=True,
            replay=True,
            key=from_body_field("orderId"),
        ),
        order_events=consumer(setting("ORDER_EVENTS_CONSUMER_NAME", "order-events"), shipment_handler, SHIPPED_SCHEMA),
        order_events_api=consumer(
            setting("ORDER_EVENTS_CONSUMER_NAME", "order-events"), shipment_handler, SHIPPED_SCHEMA, http=True
        ),
        billing=consumer(setting("BILLING_CONSUMER_NAME", "billing"), invoice_handler, SCHEMA),
        shipping=consumer(setting("SHIPPING_CONSUMER_NAME", "shipping"), picklist_handler, SCHEMA),
        order_status=consumer(
            setting("ORDER_STATUS_CONSUMER_NAME", "order-status"),
            status_handler,
            STATUS_SCHEMA,
            key=from_body_field("orderId"),
        ),
        ledger=consumer(
            setting("LEDGER_CONSUMER_NAME", "ledger"),
            ledger.posting_handler,
            ledger.SCHEMA,
            partition=ledger.account_of,
        ),
    )


@app.function_name("orders")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="ServiceBusConnection",
                               data_type=BODY_AS_BYTES)  # fmt: skip
def orders(msg: func.ServiceBusMessage) -> None:
    acknowledge_or_retry(consumers().orders.process(servicebus_delivery(msg)))


@app.function_name("billing")
@app.service_bus_topic_trigger(arg_name="msg", topic_name="%ORDER_TOPIC%", subscription_name="%BILLING_SUBSCRIPTION%",
                               connection="ServiceBusConnection", data_type=BODY_AS_BYTES)  # fmt: skip
def billing(msg: func.ServiceBusMessage) -> None:
    acknowledge_or_retry(consumers().billing.process(servicebus_delivery(msg)))


@app.function_name("shipping")
@app.service_bus_topic_trigger(arg_name="msg", topic_name="%ORDER_TOPIC%", subscription_name="%SHIPPING_SUBSCRIPTION%",
                               connection="ServiceBusConnection", data_type=BODY_AS_BYTES)  # fmt: skip
def shipping(msg: func.ServiceBusMessage) -> None:
    acknowledge_or_retry(consumers().shipping.process(servicebus_delivery(msg)))


@app.function_name("order_status")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="%ORDER_STATUS_QUEUE%", connection="ServiceBusConnection",
                               data_type=BODY_AS_BYTES)  # fmt: skip
def order_status(msg: func.ServiceBusMessage) -> None:
    acknowledge_or_retry(consumers().order_status.process(servicebus_delivery(msg)))


@app.function_name("ledger_batch")
@app.service_bus_queue_trigger(arg_name="messages", queue_name="%LEDGER_QUEUE%", connection="ServiceBusConnection",
                               cardinality="many", data_type=BODY_AS_BYTES)  # fmt: skip
def ledger_batch(messages: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006 - the worker rejects list[...]
    """With the classic binding a batch completes or is abandoned as a whole: any message
    that must be retried makes the whole batch come back, and its committed messages
    are then cheap duplicates."""
    for result in consumers().ledger.process_batch([servicebus_delivery(m) for m in messages]):
        acknowledge_or_retry(result)


@app.function_name("order_events")
@app.event_grid_trigger(arg_name="event")
def order_events(event: func.CloudEvent) -> None:
    acknowledge_or_retry(consumers().order_events.process(eventgrid_delivery(event)))


def http_consumer(name: str) -> IdempotentConsumer | func.HttpResponse:
    """A cold instance whose store is unreachable answers as a warm one does: 503 + Retry-After."""
    try:
        found: IdempotentConsumer = getattr(consumers(), name)
    except StoreUnavailable:
        return unavailable()
    return found


@app.function_name("orders_api")
@app.route(route="orders", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def orders_api(req: func.HttpRequest) -> func.HttpResponse:
    delivery = too_large(req) or http_delivery(req)
    if isinstance(delivery, func.HttpResponse):
        return delivery
    consumer = http_consumer("orders_api")
    if isinstance(consumer, func.HttpResponse):
        return consumer
    return http_response(consumer.process(delivery))


@app.function_name("events_api")
@app.route(route="events", methods=["POST", "OPTIONS"], auth_level=func.AuthLevel.FUNCTION)
def events_api(req: func.HttpRequest) -> func.HttpResponse:
    if req.method == "OPTIONS":
        return webhook_handshake(req)
    refused = too_large(req)
    if refused is not None:
        return refused
    delivery = http_cloudevent_delivery(req)
    if isinstance(delivery, str):
        return problem(400, "Not a valid CloudEvent", delivery)
    consumer = http_consumer("order_events_api")
    if isinstance(consumer, func.HttpResponse):
        return consumer
    return cloudevent_response(consumer.process(delivery))


@app.function_name("reconcile_claims")
@app.timer_trigger(arg_name="timer", schedule="0 */15 * * * *", use_monitor=True)
def reconcile_claims(timer: func.TimerRequest) -> None:
    """Escalates two-phase claims whose lease expired more than DEDUP_STALE_AFTER ago."""
    escalate_stale_claims(consumers().orders.store, duration("DEDUP_STALE_AFTER", "PT1H"))


@app.function_name("purge_markers")
@app.timer_trigger(arg_name="timer", schedule="0 30 3 * * *", use_monitor=True)
def purge_markers(timer: func.TimerRequest) -> None:
    """Table Storage has no TTL: delete expired markers, at most DEDUP_PURGE_BUDGET a run."""
    store = consumers().orders.store
    purge = store.purge_expired(utcnow(), int(setting("DEDUP_PURGE_BUDGET", "20000")))
    logging.getLogger("idempotency").info("dedup purge: scanned=%d deleted=%d requests=%d", *astuple(purge))
