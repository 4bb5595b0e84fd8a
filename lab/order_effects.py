"""What is really stored per order: the ground truth of the example's tests, demo, chaos
harness, smoke test and worker benchmark (the orders consumer's records, consumers/orders.py)."""

from __future__ import annotations

from dataclasses import dataclass

from consumers.orders import ORDER
from shared.idempotency.keys import consumer_partition
from shared.idempotency.stores import DedupStore


@dataclass
class OrderEffects:
    orders: int = 0
    charges: int = 0


def effects_by_order(
    store: DedupStore, order_id: str | None = None, consumer: str = "orders"
) -> dict[str, OrderEffects]:
    """What is really stored, per order id (of one order: in its partition of ``consumer``):
    the ground truth for tests, the demo, the chaos harness and the smoke test."""
    found: dict[str, OrderEffects] = {}
    for item in store.scan(None if order_id is None else consumer_partition(consumer, order_id)):
        if item.entity is None or "orderId" not in item.data:
            continue  # a marker or a guard
        effects = found.setdefault(item.data["orderId"], OrderEffects())
        if item.entity == ORDER:
            effects.orders += 1
        else:
            effects.charges += 1
    return found
