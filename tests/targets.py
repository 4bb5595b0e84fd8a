"""The chaos harness's target in the library's tests (lab/harness.py): the `items` function
of tests/app.py, on a stream of items."""

from __future__ import annotations

import functools
import os

from lab import workload
from lab.harness import Target
from shared.idempotency import IdempotentConsumer
from shared.idempotency.stores import DedupStore
from shared.idempotency.testing import reset
from tests import app


def items_consumer(connection: str, table: str) -> IdempotentConsumer:
    """Configure the test app as its settings would, and return the function's consumer."""
    os.environ.update(DEDUP_STORAGE_CONNECTION=connection, DEDUP_TABLE=table, DEDUP_DEADLETTER_TABLE=table + "dl")
    reset()
    return app.queue_consumer()


def postings_per_item(store: DedupStore) -> dict[str, int]:
    """An item's effect is its posting (uniquely named: a second one is visible)."""
    return {item_id: found["posting"] for item_id, found in app.effects_by_item(store).items()}


ITEMS = Target("items", items_consumer, functools.partial(workload.generate, body=workload.item), postings_per_item,
               "ITEMS_PAYMENT_URL", "itemId")  # fmt: skip
