"""The ``balances`` recipe (recipes/balances.py): entries keyed by their own ids, each changing
its account's running balance in the marker's transaction — through the function as the host
calls it, and under the chaos harness (lab/balances_chaos.py) on Table Storage (both
transports) and on ``MemoryStore``: every balance is the sum of its distinct entries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import recipes
from lab.balances_chaos import STORES, on_store, run_on, target
from lab.harness import RunConfig, run
from shared.idempotency.functions import shared_store
from shared.idempotency.keys import consumer_partition
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._records import Commit, CommitResult
from shared.idempotency.testing import entities
from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app, servicebus_message, user_function

pytestmark = pytest.mark.long("hundreds of messages under faults")

balances = recipes.module("balances")
account_balances = user_function("account_balances")


def entry(entry_id: str, account: str, direction: str, amount: float) -> dict[str, Any]:
    return {"entryId": entry_id, "accountId": account, "direction": direction, "amount": amount}


def balance_of(account: str) -> int | None:
    found = entities(shared_store(), balances.BALANCE, consumer_partition("balances", account))
    return int(found[0]["cents"]) if found else None


def test_an_entry_redelivered_changes_its_balance_once(azurite: Azurite) -> None:
    with fresh_app(azurite, BALANCES_QUEUE="balances"):
        credit, debit = entry("e-1", "a-1", "credit", 12.5), entry("e-2", "a-1", "debit", 2.25)
        account_balances(servicebus_message(credit, "e-1"))
        account_balances(servicebus_message(credit, "e-1", delivery_count=2))  # redelivered
        account_balances(servicebus_message(debit, "e-2"))
        account_balances(servicebus_message(debit, "e-2"))  # the producer's retry
        assert balance_of("a-1") == 1250 - 225
        assert sorted(e["cents"] for e in entities(shared_store()) if "direction" in e) == [-225, 1250]


def test_an_entry_under_another_id_or_account_is_refused_with_its_reason(azurite: Azurite) -> None:
    with fresh_app(azurite, BALANCES_QUEUE="balances"):
        account_balances(servicebus_message(entry("e-1", "a-1", "credit", 5), "e-1"))
        account_balances(servicebus_message(entry("e-2", "a-1", "credit", 5), "e-9"))  # MessageId is not entryId
        account_balances(servicebus_message(entry("e-1", "a-2", "credit", 5), "e-1"))  # e-1 again, other account
        reasons = sorted(record.reason for record in shared_store().dead_letters("balances"))
        assert reasons == ["key_mismatch", "key_partition_mismatch"]
        assert (balance_of("a-1"), balance_of("a-2")) == (500, None)


class VersionsIgnored(TableStore):
    """A store that changes what was read whatever changed it since (If-Match: *): the lost update
    the version check prevents. The harness's checker must catch it."""

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        return super().commit_many([c._replace(changes=tuple(replace(change, etag="*" if change.etag else None)
                                                              for change in c.changes)) for c in commits])  # fmt: skip


SHORT = RunConfig(messages=300, workers=16, dup_rate=0.3, fault_rate=0.05, seed=11, table="balances")


@pytest.mark.parametrize("kind", STORES)
def test_every_balance_is_the_sum_of_its_distinct_entries_under_chaos(azurite: Azurite, kind: str) -> None:
    report = run_on(kind, replace(SHORT, table=f"balances{kind.replace('-', '')}"), azurite, accounts=10)
    assert report.violations == []
    assert (report.double_effects, report.lost, report.orphans, report.broker_dead_lettered) == (0, 0, 0, 0)
    assert report.effects_applied == report.messages - report.dead_lettered  # each entry applied or refused
    assert sum(report.faults.values()) > 0  # crashes before and after commits, lost answers, lost locks


def test_the_checker_catches_a_balance_changed_without_its_version(azurite: Azurite) -> None:
    """16 workers on 3 accounts, no faults: without the version check concurrent entries overwrite
    each other's balance, and the run reports it."""
    broken = replace(SHORT, fault_rate=0.0, dup_rate=0.0, table="balancesbroken")
    with on_store("table-lean"):
        report = run(broken, azurite, target(accounts=3), break_store=VersionsIgnored)
    assert any(v.startswith("balance of") for v in report.violations), report.violations
