"""Test helpers around the real function app (see lab/host.py): call a function
(``user_function``) with what the host passes each trigger — ``servicebus_message``,
``cloudevent``, ``storage_queue_message``, ``http_request``, ``eventhub_batch`` with
``retry_context`` (also a timer's context), ``blob_stream``, ``timer_request`` — on a store of
the test's own (``fresh_app``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lab.host import (
    blob_stream,
    cloudevent,
    eventhub_batch,
    retry_context,
    storage_queue_message,
    timer_request,
    user_function,
)
from shared.idempotency import IdempotentConsumer
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions._bindings import http_request
from shared.idempotency.testing import app_settings, fresh_app, servicebus_message
from shared.idempotency.testing.broker import PeekLockQueue, QueuedMessage

__all__ = [
    "app_settings",
    "blob_stream",
    "cloudevent",
    "eventhub_batch",
    "fresh_app",
    "http_request",
    "ready_messages",
    "retry_context",
    "servicebus_message",
    "storage_queue_message",
    "store_down",
    "timer_request",
    "user_function",
]


@contextmanager
def store_down(consumer: IdempotentConsumer) -> Iterator[None]:
    """Every commit of this consumer fails as an unavailable store would (503)."""

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("503 injected")

    original = consumer.store.commit_many
    consumer.store.commit_many = unavailable  # type: ignore[method-assign]
    try:
        yield
    finally:
        consumer.store.commit_many = original  # type: ignore[method-assign]


def ready_messages(queue: PeekLockQueue) -> list[QueuedMessage]:
    """Every message a queue (a topic's subscription, shared/idempotency/testing/broker.py) has ready, received as a
    receiver takes them: each is locked, and counted as a delivery."""
    ready = []
    while (lock := queue.receive(timeout=0)) is not None:
        ready.append(lock.message)
    return ready
