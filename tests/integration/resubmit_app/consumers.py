"""The package's consumers, declared as an app's consumers module declares them."""

from __future__ import annotations

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import consumer, shared_store

from .handlers import checks_consumer, status_consumer, totals_consumer


@consumer
def checks() -> IdempotentConsumer:
    return checks_consumer(shared_store())


@consumer
def states() -> IdempotentConsumer:
    return status_consumer(shared_store())


@consumer
def totals() -> IdempotentConsumer:
    return totals_consumer(shared_store())
