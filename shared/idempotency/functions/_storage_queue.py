"""Storage queues: ``on_storage_queue``. Raising is the retry: the host makes the message
visible again after ``visibilityTimeout``, and moves it to ``<queue>-poison`` once it was
dequeued ``maxDequeueCount`` times (host.json ``extensions.queues``). A queue message's id is
the service's: a producer's retry enqueues a new one, so key by a business field
(``from_body_field``) unless the producer enqueues each message exactly once."""

from __future__ import annotations

import azure.functions as func

from ..messages import Delivery, in_utc
from ._host import host_setting
from ._settle import Consumer, acknowledge_or_retry

MAX_DEQUEUE_COUNT = 5  # the host's default for extensions.queues.maxDequeueCount


def on_storage_queue(consumer: Consumer, msg: func.QueueMessage) -> None:
    """Process one queue message: returning deletes it, raising makes it visible again; on its
    last dequeue, what still fails is recorded as a dead letter with its reason before the
    host moves it to the poison queue."""
    acknowledge_or_retry(consumer().process(storage_queue_delivery(msg)))


def storage_queue_delivery(msg: func.QueueMessage) -> Delivery:
    """The service's message id and dequeue count go to logs and dead-letter records; the
    dequeue count also tells the last delivery (``max_dequeue_count``); its insertion time, its
    age (a message whose producer set no expiry may outlive its marker)."""
    return Delivery(body=msg.get_body(), message_id=msg.id or None, delivery_count=msg.dequeue_count,
                    max_deliveries=max_dequeue_count(), first_enqueued_at=in_utc(msg.insertion_time))  # fmt: skip


def max_dequeue_count() -> int:
    """The host's ``extensions.queues.maxDequeueCount`` (an app setting over host.json), else
    the host's default."""
    try:
        return int(host_setting("extensions", "queues", "maxDequeueCount") or MAX_DEQUEUE_COUNT)
    except ValueError:
        return MAX_DEQUEUE_COUNT
