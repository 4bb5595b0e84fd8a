"""The example's consumers proven with the kit a user proves theirs with (docs/testing.md): the
orders (one order and one charge per order decided) and the balances recipe (every balance the
sum of its applied entries), on every store, under the kit's faults."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest

import recipes
from consumers import orders
from lab import workload
from lab.balances_chaos import entry
from shared.idempotency.testing import Accepted, Azurite, Message, Proof, Stored

balances = recipes.module("balances")
# the SDK transport is the slowest to drive: make test proves on the other two, the long lane on all
STORES = ["memory", "table-lean",
          pytest.param("table-sdk", marks=pytest.mark.long("the SDK transport, slowest to drive"))]  # fmt: skip


def order_messages(rng: random.Random, count: int) -> Iterator[Message]:
    for i in range(count):
        yield Message(workload.order(f"o-{i}", rng), f"o-{i}")


def one_order_and_one_charge_each(accepted: list[Accepted], stored: Stored) -> list[str]:
    applied = Counter(a.key for a in accepted if a.decision == "applied")
    charges = Counter(str(item.data["orderId"]) for item in stored.store.scan()
                      if item.entity and item.entity.startswith(orders.CHARGE_PREFIX))  # fmt: skip
    kept = Counter(str(o["orderId"]) for o in stored.entities(orders.ORDER))
    return [f"{key}: {kept[key]} orders, {charges[key]} charges" for key in applied | charges | kept
            if (kept[key], charges[key]) != (applied[key], applied[key])]  # fmt: skip


def entries(rng: random.Random, count: int) -> Iterator[Message]:
    """Credits and debits of 4 hot accounts."""
    for i in range(count):
        yield Message(entry(f"e-{i}", rng, accounts=4), f"e-{i}")


def balances_are_their_entries(accepted: list[Accepted], stored: Stored) -> list[str]:
    total: dict[str, int] = defaultdict(int)
    for a in accepted:
        total[a.payload["accountId"]] += balances.cents(a.payload)
    kept = {str(b["accountId"]): b["cents"] for b in stored.entities(balances.BALANCE)}
    return [f"{account}: balance {kept.get(account)}, entries {total[account]}" for account in total | kept
            if kept.get(account, 0) != total[account]]  # fmt: skip


ORDERS = Proof(orders.orders, order_messages, one_order_and_one_charge_each)
BALANCES = Proof(balances.account_balances, entries, balances_are_their_entries)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("proof", [ORDERS, BALANCES], ids=["orders", "balances"])
def test_the_examples_consumers_are_proven_on_every_store(azurite: Azurite, proof: Proof, store: str) -> None:
    verdict = proof.run(messages=120, store=store, azurite=azurite, seed=2)
    assert verdict.ok, verdict
    assert verdict.decided["applied"] > 0 and verdict.faults.total() > 0
