"""Producing orders and shipment events the way the pattern wants them produced:

- Service Bus: ``message_id`` = the business order id, so a producer retry is the same
  message — dropped by the queue's duplicate detection inside its window, absorbed by
  the consumer's markers after it; ``correlation_id``, ``content_type`` and the W3C
  trace context (``traceparent`` application property) travel with it.
- Event Grid: CloudEvents whose ``id`` is chosen by the producer (stable across retries),
  so (``source``, ``id``) identifies the event whatever happens in between.

Credentials: DefaultAzureCredential with SERVICEBUS_FULLY_QUALIFIED_NAMESPACE and
EVENTGRID_TOPIC_ENDPOINT; SERVICEBUS_CONNECTION_STRING only for local experiments
(the Service Bus emulator).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from typing import Any

from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridPublisherClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from consumers.order_events import SHIPPED


def order_message(order: dict[str, Any], *, correlation_id: str | None = None) -> ServiceBusMessage:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)  # the current span's context, if any
    return ServiceBusMessage(
        json.dumps(order, separators=(",", ":")),
        message_id=order["orderId"],
        correlation_id=correlation_id or str(uuid.uuid4()),
        content_type="application/json",
        subject="order",
        application_properties={"traceparent": carrier["traceparent"]} if "traceparent" in carrier else None,
    )


def shipped_event(order_id: str, carrier: str, tracking_number: str, *, event_id: str,
                  source: str = "/warehouse/eu") -> CloudEvent[dict[str, str]]:  # fmt: skip
    """``event_id`` must be the same on every retry of this event: derive it from the
    business fact (e.g. the shipment's id), never generate it per send."""
    data = {"orderId": order_id, "carrier": carrier, "trackingNumber": tracking_number}
    return CloudEvent(source=source, type=SHIPPED, id=event_id, subject=f"orders/{order_id}", data=data,
                      datacontenttype="application/json")  # fmt: skip


def servicebus_client() -> ServiceBusClient:
    connection = os.environ.get("SERVICEBUS_CONNECTION_STRING")
    if connection:
        return ServiceBusClient.from_connection_string(connection)
    from azure.identity import DefaultAzureCredential

    return ServiceBusClient(os.environ["SERVICEBUS_FULLY_QUALIFIED_NAMESPACE"], DefaultAzureCredential())


def eventgrid_client() -> EventGridPublisherClient:
    from azure.identity import DefaultAzureCredential

    return EventGridPublisherClient(os.environ["EVENTGRID_TOPIC_ENDPOINT"], DefaultAzureCredential())


def send_in_batches(sender: ServiceBusSender, messages: Iterable[ServiceBusMessage]) -> int:
    """As few sends as the batch size allows; returns the number of messages sent."""
    batch, count = sender.create_message_batch(), 0
    for message in messages:
        try:
            batch.add_message(message)
        except ValueError:  # the batch is full
            sender.send_messages(batch)
            batch = sender.create_message_batch()
            batch.add_message(message)
        count += 1
    if len(batch):
        sender.send_messages(batch)
    return count
