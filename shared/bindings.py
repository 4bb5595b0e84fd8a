"""The edge between Functions bindings and the dedup module: how each trigger builds a
Delivery and settles a Result. The only part of ``shared`` that imports azure.functions."""

from __future__ import annotations

import azure.functions as func

from shared.idempotency import Delivery, Result


class RetryLater(Exception):
    """Raised so that the host abandons the message (Service Bus) or retries the event
    (Event Grid): nothing was committed, or another delivery holds the claim."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.outcome.value}: {result.reason or ''} {result.key or ''}".strip())
        self.result = result


def servicebus_delivery(msg: func.ServiceBusMessage) -> Delivery:
    """Only the producer's MessageId may become the key; delivery count and the rest
    go to logs and dead-letter records."""
    return Delivery(
        body=msg.get_body(),
        message_id=msg.message_id or None,
        correlation_id=msg.correlation_id or None,
        delivery_count=msg.delivery_count,
        properties=dict(msg.application_properties or {}),
    )


def settle_servicebus(result: Result) -> None:
    """With the classic binding, returning completes the message and raising abandons it.
    Refused messages (invalid, conflict) were recorded as dead letters by the consumer
    before this point, so completing them loses nothing."""
    if not result.acknowledge:
        raise RetryLater(result)
