"""Scheduled jobs on a real store (Azurite): each item once per occurrence, through a restart
mid-run and a second instance running the same occurrence at once."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.idempotency import Context, DedupConfig, Effects, IdempotentConsumer, Outcome
from shared.idempotency.jobs import occurrence, run_job
from shared.idempotency.stores import TableStore
from shared.orders.reminders import SCHEMA, due, reminder_handler

DAY, SIX = timedelta(days=1), timedelta(hours=6)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("2026-12-01T06:00:30", "2026-12-01T06:00"),  # on time
        ("2026-12-01T05:59:57", "2026-12-01T06:00"),  # a timer a few seconds early: its own occurrence
        ("2026-12-01T05:59:30", "2026-11-30T06:00"),  # a late retry of yesterday's: still yesterday's
        ("2026-12-01T05:00:00", "2026-11-30T06:00"),  # yesterday's, past due after a restart
        ("2026-12-01T23:59:59", "2026-12-01T06:00"),  # a retry late in the day
    ],
)
def test_a_run_knows_its_occurrence_from_the_schedule(now: str, expected: str) -> None:
    assert occurrence(at(now), DAY, SIX) == at(expected)


def reminders(store: TableStore) -> Counter[tuple[str, str]]:
    return Counter((item.data["occurrence"], item.data["customerId"]) for item in store.scan()
                   if item.entity == "reminder")  # fmt: skip


class Crash(BaseException):
    pass


def consumer(store: TableStore, crash_at: set[str] | None = None) -> IdempotentConsumer:
    def handler(balance: dict[str, Any], context: Context) -> Effects:
        if crash_at is not None and balance["customerId"] in crash_at:
            crash_at.discard(balance["customerId"])
            raise Crash  # the instance dies mid-run
        return reminder_handler(balance, context)

    return IdempotentConsumer("reminders", store, handler, schema=SCHEMA, config=DedupConfig(transient_wait=DAY * 0))


def test_a_run_cut_off_mid_way_is_run_again_and_does_each_item_once(table_store: TableStore) -> None:
    day = at("2026-12-01T06:00")
    with pytest.raises(Crash):
        run_job(consumer(table_store, crash_at={"c-3"}), day, due(day), batch=1)
    assert len(reminders(table_store)) == 3  # c-0, c-1, c-2 done before the crash
    again = run_job(consumer(table_store), day, due(day))  # past due after the restart: the same occurrence
    assert (again.done, again.count(Outcome.DUPLICATE), again.count(Outcome.PROCESSED)) == (True, 3, 2)
    assert reminders(table_store) == Counter({("2026-12-01T06:00:00Z", f"c-{i}"): 1 for i in range(5)})


def test_two_instances_on_the_same_occurrence_do_each_item_once(table_store: TableStore) -> None:
    day = at("2026-12-01T06:00")
    runs = []
    threads = [threading.Thread(target=lambda: runs.append(run_job(consumer(table_store), day, due(day, 40), batch=1)))
               for _ in range(2)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(run.done for run in runs) and sum(run.count(Outcome.PROCESSED) for run in runs) == 40
    assert set(reminders(table_store).values()) == {1} and len(reminders(table_store)) == 40


def test_the_next_occurrence_reminds_again(table_store: TableStore) -> None:
    for day in (at("2026-12-01T06:00"), at("2026-12-02T06:00")):
        assert run_job(consumer(table_store), day, due(day)).count(Outcome.PROCESSED) == 5
    assert len(reminders(table_store)) == 10 and set(reminders(table_store).values()) == {1}
