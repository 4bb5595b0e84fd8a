"""Smoke test of a deployed environment: `python -m lab.client.smoke`.

Sends N orders, resends a share of them as exact duplicates and a few under the same
id with another payload, waits until every order is in the dedup store, then reports
per outcome and peeks the queue's dead-letter queue. Exit code: 1 if any order was
written twice, 2 if some never arrived or it cannot run (a setting, the store's tables, an
unreachable namespace or store: one line), 0 otherwise.

Settings (from `azd env get-values`): SERVICEBUS_FULLY_QUALIFIED_NAMESPACE (or
SERVICEBUS_CONNECTION_STRING), SERVICEBUS_QUEUE, and the app's store settings
(DEDUP_STORE, DEDUP_STORAGE_ENDPOINT or COSMOS_ENDPOINT, DEDUP_TABLE).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import HttpResponseError

from lab.order_effects import effects_by_order
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.stores import DedupStore


@dataclass(frozen=True)
class Plan:
    run: str
    orders: list[dict[str, Any]]
    duplicates: list[dict[str, Any]]  # exact resends of some orders
    mismatches: list[dict[str, Any]]  # an order's id with another amount

    @property
    def sends(self) -> list[dict[str, Any]]:
        return [*self.orders, *self.duplicates, *self.mismatches]


def make_plan(orders: int, duplicate_share: float, mismatches: int, *, run: str | None = None,
              seed: int | None = None) -> Plan:  # fmt: skip
    rng = random.Random(seed)
    run = run or f"smoke-{uuid.uuid4().hex[:8]}"
    placed: list[dict[str, Any]] = [
        {"orderId": f"{run}-{i}", "customerId": f"c-{rng.randrange(100)}", "amount": round(rng.uniform(1, 100), 2),
         "currency": "EUR", "items": [{"sku": "smoke", "quantity": 1}]}
        for i in range(orders)
    ]  # fmt: skip
    duplicates = rng.sample(placed, round(orders * duplicate_share))
    changed = [
        {**order, "amount": float(order["amount"]) + 1000} for order in rng.sample(placed, min(mismatches, orders))
    ]
    return Plan(run, placed, duplicates, changed)


@dataclass
class SmokeReport:
    plan: Plan
    written_once: int = 0
    written_twice: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dead_lettered: Counter[str] | None = field(default_factory=Counter)  # None: not readable by this identity
    broker_dead_letters: list[tuple[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.written_twice else 2 if self.missing else 0

    def render(self) -> str:
        reasons = (
            "not readable with the operator role (it excludes refused messages' bodies)"
            if self.dead_lettered is None
            else ", ".join(f"{reason} {count}" for reason, count in sorted(self.dead_lettered.items())) or "none"
        )
        broker = ", ".join(f"{mid}: {why}" for mid, why in self.broker_dead_letters[:10]) or "none"
        return "\n".join([
            f"run {self.plan.run}: sent {len(self.plan.orders)} orders, {len(self.plan.duplicates)} exact duplicates, "
            f"{len(self.plan.mismatches)} same-id/different-payload messages",
            f"orders written once: {self.written_once}",
            f"orders written twice: {len(self.written_twice)} {self.written_twice[:10]}",
            f"orders missing: {len(self.missing)} {self.missing[:10]}",
            f"duplicates suppressed: {len(self.plan.duplicates)} resends, none written again"
            if not self.written_twice else "duplicates suppressed: NO",
            f"dead-lettered by the consumer (reason: count): {reasons}",
            "  (a same-id resend inside the queue's duplicate-detection window is dropped by Service Bus "
            "before any consumer sees it)",
            f"Service Bus dead-letter queue: {broker}",
        ])  # fmt: skip


def report(store: DedupStore, scope: str, plan: Plan) -> SmokeReport:
    """Reads the store only: one partition query per order, the consumer's refusals."""
    result = SmokeReport(plan)
    for order in plan.orders:
        found = effects_by_order(store, order["orderId"]).get(order["orderId"])
        charges = found.charges if found else 0
        if charges == 0:
            result.missing.append(order["orderId"])
        elif charges == 1 and found is not None and found.orders == 1:
            result.written_once += 1
        else:
            result.written_twice.append(order["orderId"])
    try:
        records = store.dead_letters(scope)
    except (HttpResponseError, StoreUnavailable) as exc:  # the store maps a 403 to StoreUnavailable
        refusal = exc if isinstance(exc, HttpResponseError) else exc.__cause__
        if getattr(refusal, "status_code", None) != 403:
            raise
        result.dead_lettered = None
        return result
    ours = [record for record in records if (record.key_id or record.message_id or "").startswith(plan.run)]
    result.dead_lettered = Counter(record.reason for record in ours)
    return result


def checked(store: DedupStore) -> None:
    """The store's tables exist (a mistyped table is refused before an order is sent); one it may
    not read (a 403: a role for the records only) is read as ``report`` reads it."""
    try:
        store.check_tables()
    except StoreUnavailable as exc:
        if getattr(exc.__cause__, "status_code", None) != 403:
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.client.smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=50)
    parser.add_argument("--duplicate-share", type=float, default=0.3)
    parser.add_argument("--mismatches", type=int, default=3)
    parser.add_argument("--wait", type=float, default=300, help="seconds to wait for every order")
    parser.add_argument("--consumer", default="orders")
    args = parser.parse_args(argv)

    from azure.servicebus import ServiceBusSubQueue

    from lab.client.producer import order_message, send_in_batches, servicebus_client
    from shared.idempotency.commands import one_line_errors
    from shared.idempotency.config import setting
    from shared.idempotency.stores._settings import app_store

    if not (os.environ.get("SERVICEBUS_FULLY_QUALIFIED_NAMESPACE") or os.environ.get("SERVICEBUS_CONNECTION_STRING")):
        print(
            "smoke: set SERVICEBUS_FULLY_QUALIFIED_NAMESPACE (or SERVICEBUS_CONNECTION_STRING) and the app's "
            "store settings (DEDUP_STORAGE_ENDPOINT or COSMOS_ENDPOINT); see README, Deploy",
            file=sys.stderr,
        )
        return 2
    plan = make_plan(args.orders, args.duplicate_share, args.mismatches)
    with one_line_errors("smoke", unreachable="cannot reach Service Bus or the store: "):
        queue = os.environ.get("SERVICEBUS_QUEUE") or setting("ORDERS_QUEUE", "orders")
        store = app_store(create=False)
        checked(store)  # before anything is sent: the store the orders are looked for in
        with servicebus_client() as client:
            with client.get_queue_sender(queue) as sender:
                send_in_batches(sender, (order_message(order) for order in plan.orders))
                send_in_batches(sender, (order_message(order) for order in plan.duplicates + plan.mismatches))
            deadline = time.monotonic() + args.wait
            result = report(store, args.consumer, plan)
            while result.missing and time.monotonic() < deadline:
                time.sleep(5)
                result = report(store, args.consumer, plan)
            with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                peeked = dlq.peek_messages(max_message_count=250)
            result.broker_dead_letters = [(str(m.message_id), str(m.dead_letter_reason)) for m in peeked
                                          if str(m.message_id).startswith(plan.run)]  # fmt: skip
    print(result.render())
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
