"""Scheduled jobs on a real store (Azurite): each item once per occurrence, through a restart
mid-run and a second instance running the same occurrence at once; an occurrence whose every
try failed is caught up by the next run. On the library tests' job (tests/app.py: ``due``,
``job_handler``)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency import Context, DedupConfig, Effects, IdempotentConsumer, Outcome
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions import RetryLater, on_schedule
from shared.idempotency.functions import _schedule as schedule
from shared.idempotency.jobs import complete, occurrence, run_job
from shared.idempotency.stores import TableStore
from shared.idempotency.testing.azurite import Azurite
from tests.app import SCHEMA, due, job_handler

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
    return Counter((item.data["occurrence"], item.data["itemId"]) for item in store.scan()
                   if item.entity == "reminder")  # fmt: skip


class Crash(BaseException):
    pass


def consumer(store: TableStore, crash_at: set[str] | None = None) -> IdempotentConsumer:
    def handler(body: dict[str, Any], context: Context) -> Effects:
        if crash_at is not None and body["id"] in crash_at:
            crash_at.discard(body["id"])
            raise Crash  # the instance dies mid-run
        return job_handler(body, context)

    return IdempotentConsumer("item-job", store, handler, schema=SCHEMA, config=DedupConfig(transient_wait=DAY * 0))


def test_a_run_cut_off_mid_way_is_run_again_and_does_each_item_once(table_store: TableStore) -> None:
    day = at("2026-12-01T06:00")
    with pytest.raises(Crash):
        run_job(consumer(table_store, crash_at={"i-3"}), day, due(day), batch=1)
    assert len(reminders(table_store)) == 3  # i-0, i-1, i-2 done before the crash
    again = run_job(consumer(table_store), day, due(day))  # past due after the restart: the same occurrence
    assert (again.done, again.count(Outcome.DUPLICATE), again.count(Outcome.PROCESSED)) == (True, 3, 2)
    assert reminders(table_store) == Counter({("2026-12-01T06:00:00Z", f"i-{i}"): 1 for i in range(5)})


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


def retry(count: int, most: int = 3) -> Any:
    return SimpleNamespace(retry_context=SimpleNamespace(retry_count=count, max_retry_count=most))


def test_a_day_whose_every_try_failed_is_caught_up_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store down through all four tries of a day: nothing could be parked, the day's
    reminders never went out. The next day's run does that day's items first, then its own;
    past the catch-up bound, the occurrences left out are logged as lost, with their count."""
    with Azurite(location=tmp_path) as server:
        service = TableServiceClient.from_connection_string(server.connection_string, retry_total=0)
        store = TableStore(service, "jobs", "jobsdl")
        store.create_tables()
        c = consumer(store)

        def run(now: str, tries: Any) -> None:
            monkeypatch.setattr(schedule, "utcnow", lambda: at(now))
            on_schedule(lambda: c, DAY, SIX, due, tries)

        run("2026-12-01T06:00:10", retry(0))
        server.stop()
        for attempt in range(4):  # the retry policy's four tries, every one failing
            with pytest.raises(StoreUnavailable):
                run(f"2026-12-02T06:0{attempt}:10", retry(attempt))
        server.start()
        run("2026-12-03T06:00:10", retry(0))
        days = Counter(day for day, _ in reminders(store))
        assert days == {"2026-12-01T06:00:00Z": 5, "2026-12-02T06:00:00Z": 5, "2026-12-03T06:00:00Z": 5}
        run("2026-12-03T07:00:00", retry(0))  # a past-due run of the same day: nothing more
        assert sum(reminders(store).values()) == 15 and set(reminders(store).values()) == {1}
        with caplog.at_level(logging.ERROR, logger="idempotency"):
            run("2026-12-13T06:00:10", retry(0))  # 9 days missed, 7 caught up
        assert sum(reminders(store).values()) == 15 + 8 * 5 and set(reminders(store).values()) == {1}
        assert "2026-12-04T06:00:00Z" not in Counter(day for day, _ in reminders(store))
        [lost] = [record for record in caplog.records if record.levelno >= logging.ERROR]
        assert lost.getMessage().startswith("dedup job item-job: 2 occurrences after 2026-12-03T06:00:00Z")


def test_an_occurrence_whose_items_cannot_be_listed_never_stops_the_others(
    table_store: TableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its items' query fails for one caught-up day: the other days run; that day is tried
    again by the retries, then by the next runs, until it can be listed."""
    c = consumer(table_store)
    broken = {"2026-12-02T06:00:00Z"}

    def items(when: datetime) -> Any:
        if f"{when:%Y-%m-%dT%H:%M:%SZ}" in broken:
            raise ConnectionError("the items' database is down")
        return due(when)

    def run(now: str, tries: Any) -> None:
        monkeypatch.setattr(schedule, "utcnow", lambda: at(now))
        on_schedule(lambda: c, DAY, SIX, items, tries)

    run("2026-12-01T06:00:10", retry(0))
    complete(c, at("2026-12-01T06:00"))  # then two days with no run at all
    with pytest.raises(RetryLater):  # retries left: the host runs it again
        run("2026-12-04T06:00:10", retry(0))
    run("2026-12-04T06:03:10", retry(3))  # the last try: the other days are done, the broken one waits
    days = Counter(day for day, _ in reminders(table_store))
    assert days == {"2026-12-01T06:00:00Z": 5, "2026-12-03T06:00:00Z": 5, "2026-12-04T06:00:00Z": 5}
    broken.clear()
    run("2026-12-05T06:00:10", retry(0))  # the next run does the missed day, the done ones are duplicates
    days = Counter(day for day, _ in reminders(table_store))
    assert set(days) == {f"2026-12-0{d}T06:00:00Z" for d in range(1, 6)} and set(days.values()) == {5}
    assert set(reminders(table_store).values()) == {1}
