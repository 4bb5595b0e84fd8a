"""What every trigger's settlement shares: ``RetryLater`` (the host abandons the message or
retries the event), and for a source that moves on whatever the function answers (an Event
Hubs checkpoint, a timer's occurrence), parking on the last try."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..consumer import IdempotentConsumer
from ..errors import DedupError
from ..messages import Delivery, Result

Consumer = Callable[[], IdempotentConsumer]  # a consumer declared with @consumer


class RetryLater(DedupError):
    """Raised so that the host abandons the message (Service Bus) or retries the event
    (Event Grid): nothing was committed, or another delivery holds the claim."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.outcome.value}: {result.reason or ''} {result.key or ''}".strip())
        self.result = result


def acknowledge_or_retry(result: Result) -> None:
    """Service Bus (classic binding) and Event Grid: returning completes the message or
    accepts the event, raising abandons it or makes Event Grid retry with backoff.
    Refused messages (invalid, conflict) were recorded as dead letters by the consumer
    before this point, so accepting them loses nothing and stops useless retries."""
    if not result.acknowledge:
        raise RetryLater(result)


def retries_left(context: Any) -> bool:
    """Whether the function's retry policy runs it again if it fails now (-1: without end)."""
    retry = getattr(context, "retry_context", None)
    return retry is not None and (retry.max_retry_count < 0 or retry.retry_count < retry.max_retry_count)


def settle_or_park(consumer: IdempotentConsumer, failing: list[tuple[Delivery, Result]], context: Any) -> None:
    """For a source that moves on whatever the function answers (an Event Hubs checkpoint, a
    timer's occurrence): raise while the function's retry policy has tries left (the host
    runs it again); on the last try park every failing message — those the store could not
    record tried again for up to ``dead_letters.PARK_WAIT`` — then raise if one still could not."""
    if not failing:
        return
    if retries_left(context):
        raise RetryLater(failing[0][1])
    unrecorded = [r for r in consumer.park(failing) if not r.acknowledge]
    if unrecorded:  # the store is down too: nothing more can be done here (docs/triggers.md)
        raise RetryLater(unrecorded[0])
