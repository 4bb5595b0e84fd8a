"""Running balances under chaos (``make chaos``; ``python -m lab.balances_chaos``): the balances
recipe's entries (recipes/balances.py) — credits and debits keyed by their own ids, each
changing its account's balance in the marker's transaction — delivered at least once to
competing workers with producer duplicates, crashes before and after the commit, answers lost
after the store applied it, lost locks and a store outage, on Table Storage (both transports)
and on ``MemoryStore``. Then, from what is stored: every entry applied once or dead-lettered
with its reason (lab/harness.py), and every account's balance exactly the sum of its entries,
each entry one of the amounts sent under its key. Commits refused because another entry of
the account moved the balance first (``contended``) are decided again, and counted.

Knobs (environment): BALANCES_MESSAGES (5000), BALANCES_ACCOUNTS (50), BALANCES_WORKERS (16),
CHAOS_SEED (random when unset), BALANCES_STORES (table-lean,table-sdk,memory)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import recipes
from lab import workload
from lab.harness import Report, RunConfig, Target, run, seed_setting
from shared.idempotency import IdempotentConsumer
from shared.idempotency.config import whole
from shared.idempotency.errors import ConfigurationError
from shared.idempotency.stores import DedupStore, MemoryStore
from shared.idempotency.testing import reset, using_store
from shared.idempotency.testing.azurite import Azurite

balances = recipes.module("balances")
STORES = ("table-lean", "table-sdk", "memory")


def entry(entry_id: str, rng: random.Random, accounts: int = 50) -> dict[str, object]:
    """A credit or a debit of one of ``accounts`` accounts (its key first, as workload shapes are)."""
    return {"entryId": entry_id, "accountId": f"acct-{rng.randrange(accounts)}",
            "direction": rng.choice(("credit", "debit")), "amount": round(rng.uniform(1, 500), 2)}  # fmt: skip


def app_consumer(connection: str, table: str) -> IdempotentConsumer:
    """The recipe's consumer on ``table`` (on a store ``using_store`` substitutes, if any)."""
    os.environ.update(DEDUP_STORAGE_CONNECTION=connection, DEDUP_TABLE=table, DEDUP_DEADLETTER_TABLE=table + "dl")
    reset()
    consumer: IdempotentConsumer = balances.balances_consumer()
    return consumer


def entries_per_key(store: DedupStore) -> dict[str, int]:
    """How often each entry is stored (its record, named by its key)."""
    found: dict[str, int] = defaultdict(int)
    for item in store.scan():
        if item.entity and item.entity.startswith("entry|"):
            found[item.entity.split("|", 1)[1]] += 1
    return found


def balances_hold(store: DedupStore, in_play: list[workload.LogicalMessage]) -> list[str]:
    """Every balance is the sum of its account's stored entries, and every stored entry is one of
    the amounts sent under its key: with the harness's exactly-once check, every balance is the
    sum of its distinct messages."""
    sent: dict[str, set[int]] = defaultdict(set)
    for message in in_play:
        if message.key is not None:
            sent[message.key].add(balances.cents(json.loads(message.body)))
    totals: dict[str, int] = defaultdict(int)
    stored: dict[str, int] = {}
    problems = []
    for item in store.scan():
        if item.entity and item.entity.startswith("entry|"):
            totals[str(item.data["accountId"])] += int(str(item.data["cents"]))
            if item.data["cents"] not in sent[item.entity.split("|", 1)[1]]:
                problems.append(f"entry not as sent: {item.entity} {item.data['cents']}")
        elif item.entity == balances.BALANCE:
            stored[str(item.data["accountId"])] = int(str(item.data["cents"]))
    for account in sorted(totals.keys() | stored.keys()):
        if stored.get(account, 0) != totals.get(account, 0):
            problems.append(f"balance of {account}: {stored.get(account)} stored, its entries sum to {totals[account]}")
    return problems


def target(accounts: int) -> Target:
    shape = functools.partial(entry, accounts=accounts)
    return Target("account_balances", app_consumer, functools.partial(workload.generate, body=shape), entries_per_key,
                  "BALANCES_PAYMENT_URL", "entryId", balances_hold)  # fmt: skip


@contextmanager
def on_store(kind: str) -> Iterator[None]:
    """The app's consumers on ``kind``: Table Storage with lean or SDK transactions, or memory."""
    previous = os.environ.get("DEDUP_TABLE_TRANSACTIONS")
    os.environ["DEDUP_TABLE_TRANSACTIONS"] = "sdk" if kind == "table-sdk" else "lean"
    try:
        if kind == "memory":
            with using_store(MemoryStore()):
                yield
        else:
            yield
    finally:
        os.environ.pop("DEDUP_TABLE_TRANSACTIONS")
        if previous is not None:
            os.environ["DEDUP_TABLE_TRANSACTIONS"] = previous
        reset()


def run_on(kind: str, config: RunConfig, azurite: Azurite, accounts: int) -> Report:
    with on_store(kind):
        return run(config, azurite, target(accounts))


def config_from_env() -> tuple[RunConfig, int, list[str]]:
    env = os.environ.get
    config = RunConfig(messages=whole("BALANCES_MESSAGES", "5000"), workers=whole("BALANCES_WORKERS", "16"),
                       dup_rate=0.3, fault_rate=0.05, seed=seed_setting(),
                       outage=True, table="chaosbalances")  # fmt: skip
    stores = env("BALANCES_STORES", ",".join(STORES)).split(",")
    if unknown := sorted(set(stores) - set(STORES)):
        raise ConfigurationError(f"BALANCES_STORES names {unknown}: choose from {', '.join(STORES)}")
    return config, whole("BALANCES_ACCOUNTS", "50"), stores


def summary(kind: str, report: Report) -> dict[str, object]:
    return {"store": kind, "messages": report.messages, "deliveries": report.deliveries,
            "workers": report.config.workers, "faults_injected": sum(report.faults.values()),
            "store_restarts": report.store_restarts, "contended": report.outcomes["contended"],
            "applied": report.effects_applied, "double": report.double_effects, "lost": report.lost,
            "dead_lettered": report.dead_lettered, "broker_dead_lettered": report.broker_dead_lettered,
            "orphans": report.orphans, "violations": report.violations[:5], "seed": report.config.seed,
            "seconds": round(report.seconds, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    try:
        config, accounts, kinds = config_from_env()
    except ConfigurationError as exc:
        print(f"python -m lab.balances_chaos: {exc}", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory(prefix="balances-azurite-") as data, Azurite(location=Path(data)) as azurite:
        for n, kind in enumerate(kinds):
            report = run_on(kind, RunConfig(**{**config.__dict__, "table": f"{config.table}{n}"}), azurite, accounts)
            print(f"Balances ({kind}): {json.dumps(summary(kind, report))}")
            ok = report.ok and ok
    if not ok:
        print(f"FAILED: invariants violated (reproduce with CHAOS_SEED={config.seed})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
