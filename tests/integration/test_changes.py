"""Effects that change what is stored, in the marker's transaction (``context.read``,
``Effects.changes``), on the real stores: a running total per account kept by credits keyed by
their own ids, in the account's partition (``partition_from``). Under concurrent deliveries of
the same accounts every total is the sum of its distinct credits — none twice, none lost, none
dead-lettered for contention; a key reused under another account is a recorded conflict; a
batch of one account's credits reads once and commits once."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, from_body_field
from shared.idempotency.config import DedupConfig
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.messages import Delivery, Outcome
from shared.idempotency.reasons import Reason
from shared.idempotency.stores import DedupStore, MemoryStore
from shared.idempotency.stores._records import Commit, CommitResult, CommitStatus
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite
from tests.conftest import CHANGING_STORES, changing_store, new_table_store

SCHEMA = {
    "type": "object",
    "required": ["creditId", "accountId", "amount"],
    "properties": {"creditId": {"type": "string"}, "accountId": {"type": "string"}, "amount": {"type": "integer"}},
}


def credit(message: dict[str, Any], context: Context) -> Effects:
    total = context.read("total")
    balance = (total.data or {}).get("balance", 0) + message["amount"]
    return Effects([Entity(f"credit|{message['creditId']}", message)],
                   changes=[total.merged({"accountId": message["accountId"], "balance": balance})])  # fmt: skip


def totals(store: DedupStore, *, keyed_by_account: bool = False) -> IdempotentConsumer:
    """Keyed by the credit, in its account's partition (``partition_from``: each new key pinned to
    it, one request); ``keyed_by_account``: keyed ``<account>:<credit>``, the partition derived
    from the key (``partition_for``), nothing to pin."""
    where: dict[str, Any] = ({"key_source": lambda _, m: f"{m['accountId']}:{m['creditId']}",
                              "partition_for": lambda key: key.id.split(":", 1)[0]} if keyed_by_account
                             else {"key_source": from_body_field("creditId"),
                                   "partition_from": from_body_field("accountId")})  # fmt: skip
    return IdempotentConsumer("totals", store, credit, schema=SCHEMA, reads=lambda message: ["total"],
                              config=DedupConfig(transient_wait=timedelta(seconds=60)), **where)  # fmt: skip


class Counted:
    """The store's commits and reads, counted as they are sent."""

    def __init__(self, store: DedupStore) -> None:
        self.store, self.commits, self.reads, self.statuses = store, 0, 0, Counter[CommitStatus]()
        self._lock = threading.Lock()
        commit_many, read_current = store.commit_many, store.read_current

        def counted_commit(commits: Sequence[Commit]) -> list[CommitResult]:
            results = commit_many(commits)
            with self._lock:
                self.commits += 1
                self.statuses.update(r.status for r in results)
            return results

        def counted_read(*args: Any) -> Any:
            with self._lock:
                self.reads += 1
            return read_current(*args)

        store.commit_many = counted_commit  # type: ignore[method-assign]
        store.read_current = counted_read  # type: ignore[method-assign]


@pytest.fixture(params=CHANGING_STORES)
def store(request: pytest.FixtureRequest) -> DedupStore:
    return changing_store(request, request.param)


def delivery(message: dict[str, Any], count: int = 1) -> Delivery:
    return Delivery(json.dumps(message).encode(), message_id=None, delivery_count=count)


def balances(store: DedupStore, accounts: Sequence[str]) -> dict[str, int]:
    found = {}
    for account in accounts:
        [total] = [e for e in store.read_entities(f"totals|{account}", "total", 1) if e.name == "total"] or [None]
        found[account] = total.data["balance"] if total else 0
    return found


def test_concurrent_credits_of_the_same_accounts_each_count_once(store: DedupStore) -> None:
    accounts = [f"a-{n}" for n in range(6)]
    rng = random.Random(7)
    credits = [{"creditId": f"c-{n}", "accountId": rng.choice(accounts), "amount": rng.randint(1, 100)}
               for n in range(60)]  # fmt: skip
    sent = credits + rng.sample(credits, 18)  # 30 % sent twice
    rng.shuffle(sent)
    counted = Counted(store)
    consumer = totals(store)
    pending, lock, outcomes = list(sent), threading.Lock(), Counter[Outcome]()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                message = pending.pop()
            result = consumer.process(delivery(message))
            with lock:
                outcomes[result.outcome] += 1
                if not result.acknowledge:  # the broker delivers it again
                    pending.append(message)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {a: sum(c["amount"] for c in credits if c["accountId"] == a) for a in accounts}
    assert balances(store, accounts) == expected
    for account in accounts:  # one credit record per distinct credit
        recorded = store.read_entities(f"totals|{account}", "credit|", 1000)
        assert sorted(e.name for e in recorded) == sorted(f"credit|{c['creditId']}" for c in credits
                                                          if c["accountId"] == account)  # fmt: skip
    assert outcomes[Outcome.PROCESSED] == len(credits) and outcomes[Outcome.DUPLICATE] == len(sent) - len(credits)
    assert not store.dead_letters("totals"), "a credit was dead-lettered"
    assert counted.statuses[CommitStatus.NEW] == len(credits)  # every contended commit decided again, once


def test_a_duplicate_costs_one_read_and_never_runs_the_handler(store: DedupStore) -> None:
    consumer, counted = totals(store), Counted(store)
    message = {"creditId": "c-1", "accountId": "a-1", "amount": 5}
    assert consumer.process(delivery(message)).outcome is Outcome.PROCESSED
    assert (counted.reads, counted.commits) == (1, 1)
    again = totals(store)  # another instance: no cache of completed keys
    assert again.process(delivery(message, 2)).outcome is Outcome.DUPLICATE
    assert (counted.reads, counted.commits) == (2, 1)
    assert balances(store, ["a-1"]) == {"a-1": 5}


def test_a_key_reused_under_another_partition_is_a_recorded_conflict_applied_once(store: DedupStore) -> None:
    consumer = totals(store)
    assert consumer.process(delivery({"creditId": "c-1", "accountId": "a-1", "amount": 5})).outcome is Outcome.PROCESSED
    result = consumer.process(delivery({"creditId": "c-1", "accountId": "a-2", "amount": 5}))
    assert (result.outcome, result.reason) == (Outcome.CONFLICT, Reason.KEY_PARTITION_MISMATCH)
    assert balances(store, ["a-1", "a-2"]) == {"a-1": 5, "a-2": 0}
    assert [r.reason for r in store.dead_letters("totals")] == [Reason.KEY_PARTITION_MISMATCH]


def test_a_batch_of_one_accounts_credits_reads_once_and_commits_once(azurite: Azurite) -> None:
    """40 credits of one account, keyed so that the partition derives from the key: one read of
    the total, one commit call (on Table Storage two
    transactions: guard, marker and credit per message, and the total once, 100 operations to
    one); redelivered whole, the read finds every marker (3 queries of 14 rows) and nothing is
    committed."""
    sent: Counter[str] = Counter()
    store = new_table_store(azurite, lean=True, hook=lambda request: sent.update([request.http_request.method]))
    consumer, counted = totals(store, keyed_by_account=True), Counted(store)
    batch = [delivery({"creditId": f"c-{n}", "accountId": "a-1", "amount": n}) for n in range(40)]
    sent.clear()
    results = consumer.process_batch(batch)
    assert [r.outcome for r in results] == [Outcome.PROCESSED] * 40
    assert (counted.reads, counted.commits, sent["GET"], sent["POST"]) == (1, 1, 1, 2)
    assert balances(store, ["a-1"]) == {"a-1": sum(range(40))}
    sent.clear()
    again = totals(store, keyed_by_account=True).process_batch([delivery(json.loads(d.body), 2) for d in batch])
    assert [r.outcome for r in again] == [Outcome.DUPLICATE] * 40
    assert (counted.reads, counted.commits, sent["GET"], sent["POST"]) == (2, 1, 3, 0)


def test_a_batch_folds_on_every_store(store: DedupStore) -> None:
    consumer, counted = totals(store), Counted(store)
    batch = [delivery({"creditId": f"c-{n}", "accountId": "a-1", "amount": n}) for n in range(40)]
    assert [r.outcome for r in consumer.process_batch(batch)] == [Outcome.PROCESSED] * 40
    assert (counted.reads, counted.commits) == (1, 1)
    assert balances(store, ["a-1"]) == {"a-1": sum(range(40))}


def test_a_step_beside_a_change_is_called_once_and_the_change_applied_once(store: DedupStore) -> None:
    """Two-phase beside a change: the handler calls out (a step), then changes the total. The first
    commit fails after the call; the redelivery finds the step done (not called again) and commits
    the change once; a later duplicate runs nothing."""
    called: list[str] = []

    def notify(key: str) -> dict[str, Any]:
        called.append(key)
        return {"sent": True}

    def handler(message: dict[str, Any], context: Context) -> Effects:
        context.step("notify", notify)
        return credit(message, context)

    consumer = IdempotentConsumer("totals", store, handler, schema=SCHEMA, reads=lambda message: ["total"],
                                  key_source=from_body_field("creditId"), partition_from=from_body_field("accountId"),
                                  config=DedupConfig(transient_wait=timedelta(0)))  # fmt: skip
    message = {"creditId": "c-1", "accountId": "a-1", "amount": 5}
    commit_many = store.commit_many

    def unavailable(commits: Sequence[Commit]) -> list[CommitResult]:
        store.commit_many = commit_many  # type: ignore[method-assign]  # the next one goes through
        raise StoreUnavailable("503 injected")

    store.commit_many = unavailable  # type: ignore[method-assign]
    assert consumer.process(delivery(message)).outcome is Outcome.TRANSIENT
    assert consumer.process(delivery(message, 2)).outcome is Outcome.PROCESSED
    assert totals(store).process(delivery(message, 3)).outcome is Outcome.DUPLICATE
    assert len(called) == 1 and balances(store, ["a-1"]) == {"a-1": 5}


def test_an_entity_too_hot_for_the_wait_goes_back_as_contended_and_writes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another writer changes the total between every read and commit: the message is decided
    again within its wait (each refusal logged as ``contended``), then goes back to the broker with
    the reason ``contended`` — nothing written, nothing dead-lettered."""
    store = MemoryStore()
    partition = totals(store).identify(delivery({"creditId": "c-1", "accountId": "a-1", "amount": 5}))[1]
    attempts = 0

    def raced(message: dict[str, Any], context: Context) -> Effects:
        nonlocal attempts
        attempts += 1
        effects = credit(message, context)
        store.put_entity(partition, Entity("total", {"balance": 1000 + attempts}))  # another writer, meanwhile
        return effects

    consumer = IdempotentConsumer("totals", store, raced, schema=SCHEMA, reads=lambda message: ["total"],
                                  key_source=from_body_field("creditId"), partition_from=from_body_field("accountId"),
                                  config=DedupConfig(transient_wait=timedelta(seconds=0.5)))  # fmt: skip
    with caplog.at_level("INFO", logger="idempotency"):
        result = consumer.process(delivery({"creditId": "c-1", "accountId": "a-1", "amount": 5}))
    assert (result.outcome, result.reason, result.acknowledge) == (Outcome.TRANSIENT, Reason.CONTENDED, False)
    logged = [fields_of(r) for r in caplog.records]
    refusals = [f for f in logged if f.get("reason") == "contended" and "outcome" not in f]
    assert attempts >= 2 and len(refusals) == attempts  # each attempt refused, each logged
    assert [f["outcome"] for f in logged if "outcome" in f] == ["transient"]  # then one outcome, its reason contended
    assert store.read_entities(partition, "credit|", 10) == [] and store.dead_letters("totals") == []


def test_a_message_whose_changes_overfill_a_commit_is_invalid_at_once_and_alone(store: DedupStore) -> None:
    """Entities and changed entities together beyond what one commit holds: dead-lettered
    ``too_many_effects`` at the first delivery, nothing of it written, and the credit beside it
    in the same batch committed — not a store error that fails the whole batch until the DLQ."""

    def handler(message: dict[str, Any], context: Context) -> Effects:
        if message["amount"] >= 0:
            return credit(message, context)
        lines = [Entity(f"line|{i}", {"n": i}) for i in range(store.max_effects - 1)]
        return Effects(lines, changes=[context.read(name).merged({"n": 1}) for name in ("total", "count")])

    consumer = IdempotentConsumer("totals", store, handler, schema=SCHEMA, reads=lambda message: ["total", "count"],
                                  key_source=from_body_field("creditId"),
                                  partition_from=from_body_field("accountId"))  # fmt: skip
    batch = [delivery({"creditId": "big", "accountId": "a-1", "amount": -1}),
             delivery({"creditId": "c-1", "accountId": "a-1", "amount": 5})]  # fmt: skip
    results = consumer.process_batch(batch)
    assert [(r.outcome, r.reason) for r in results] == [(Outcome.INVALID, Reason.TOO_MANY_EFFECTS),
                                                        (Outcome.PROCESSED, None)]  # fmt: skip
    assert "2 changed entities" in results[0].detail
    assert [r.reason for r in store.dead_letters("totals")] == ["too_many_effects"]
    assert balances(store, ["a-1"]) == {"a-1": 5}
    assert store.read_entities("totals|a-1", "line|", 100) == []
