"""Service Bus queues and subscriptions: ``on_servicebus`` (one message) and
``on_servicebus_batch`` (``cardinality="many"``), with ``BODY_AS_BYTES`` on the trigger."""

from __future__ import annotations

import azure.functions as func

from ..facts import KEY_PROPERTY, first_enqueued
from ..messages import Delivery, in_utc
from ._settle import Consumer, acknowledge_or_retry

# Service Bus bodies reach the function as the producer's bytes. With the default (string)
# the host also merges a JSON body's top-level fields into the trigger metadata, where a body
# field named "MessageId" would replace the broker's MessageId, the dedup key; a batch would
# be re-serialised, and a body that is not JSON would fail the whole batch before our code.
BODY_AS_BYTES = func.DataType.BINARY


def on_servicebus(consumer: Consumer, msg: func.ServiceBusMessage) -> None:
    """Process one Service Bus message: returning completes it, raising abandons it."""
    acknowledge_or_retry(consumer().process(servicebus_delivery(msg)))


def on_servicebus_batch(consumer: Consumer, messages: list[func.ServiceBusMessage]) -> None:
    """Process a batch (``cardinality="many"``). With the classic binding a batch completes or
    is abandoned as a whole: one message to retry brings the batch back, and its committed
    messages are then cheap duplicates."""
    for result in consumer().process_batch([servicebus_delivery(m) for m in messages]):
        acknowledge_or_retry(result)


def servicebus_delivery(msg: func.ServiceBusMessage) -> Delivery:
    """Only the producer's MessageId may become the key — or, for a message sent again under a
    new MessageId (resend.py), the original's, in its ``dedup-key`` property; delivery count
    and the rest go to logs and dead-letter records."""
    properties = dict(msg.application_properties or {})
    traceparent = properties.get("traceparent") or properties.get("Diagnostic-Id")
    resent_as = properties.get(KEY_PROPERTY)
    return Delivery(
        body=msg.get_body(),
        message_id=str(resent_as) if resent_as else msg.message_id or None,
        correlation_id=msg.correlation_id or None,
        delivery_count=msg.delivery_count,
        traceparent=str(traceparent) if traceparent else None,
        properties=properties,
        sequence=msg.sequence_number,
        enqueued_at=in_utc(msg.enqueued_time_utc),
        first_enqueued_at=first_enqueued(properties),
    )
