"""Scheduled jobs, exactly once per item and occurrence. A timer runs one schedule at a time,
but a restart re-runs a past-due occurrence and a run can be cut off mid-way; two instances
may even start the same occurrence. Each item of a run is a message whose key is
(occurrence, item id): a re-run, or a second instance, meets the markers of what was done
and does the rest — nothing twice; an item still failing when the retries run out is parked
with its reason for the replay tool, never silently skipped.

The occurrence is derived from the schedule and the clock (the latest scheduled time at or
before now, with a little skew), never from the invocation: every run of it agrees.

**Catching up.** An occurrence whose every try failed (the store down all along: nothing
could even be parked) is not lost: the job records the last occurrence it finished
(``complete``), and the next run does every occurrence since (``pending``), oldest first —
a past-due run that starts after the next occurrence too. At most ``catch_up`` occurrences
are caught up; older ones are logged at ERROR with their count, the loss stated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .consumer import IdempotentConsumer
from .messages import JSON, Delivery, Entity, Outcome, Result

log = logging.getLogger("idempotency")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SKEW = timedelta(seconds=5)  # a timer that fires a little early still runs its own occurrence
CATCH_UP = 7  # occurrences a run may catch up (a daily job: a week of failed runs)
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def occurrence(now: datetime, every: timedelta, at: timedelta = timedelta(0)) -> datetime:
    """The scheduled time a run at ``now`` is for: the latest ``at + k * every`` (UTC, from
    1970-01-01) at or before ``now + SKEW``. A daily job at 06:00: ``every=1 day, at=6 h``.
    ``every`` and ``at`` must describe the trigger's own (UTC) schedule, and a run or a retry
    must end before the next occurrence: a retry after it counts for the next one."""
    periods = (now + SKEW - EPOCH - at) // every
    return EPOCH + at + periods * every


@dataclass(frozen=True)
class JobRun:
    occurrence: datetime
    deliveries: list[Delivery]
    results: list[Result]

    @property
    def done(self) -> bool:
        """Every item acknowledged (applied now, before, or refused with a record)."""
        return all(result.acknowledge for result in self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(result.outcome is outcome for result in self.results)


def run_job(consumer: IdempotentConsumer, when: datetime, items: Iterable[tuple[str, JSON]], *,
            batch: int = 50) -> JobRun:  # fmt: skip
    """Process each (item id, item) of the occurrence ``when`` as one message keyed
    ``<occurrence>/<item id>``. Items wait out transient failures as any delivery does; one
    that still fails is left for the next run of the occurrence (``JobRun.done`` is False:
    fail the invocation, so that the timer's retry policy runs it again)."""
    stamp = f"{when:{_STAMP}}"
    # No delivery count: nobody is sure to run it again (its outgoing messages are parked).
    deliveries = [
        Delivery(json.dumps(item, ensure_ascii=False).encode(), message_id=f"{stamp}/{item_id}")
        for item_id, item in items
    ]
    results: list[Result] = []
    for start in range(0, len(deliveries), batch):
        results += consumer.process_batch(deliveries[start : start + batch])
    return JobRun(when, deliveries, results)


def _cursor(consumer: IdempotentConsumer) -> str:
    return f"~job|{consumer.name}"  # consumer names never start with "~": no message's partition


def last_completed(consumer: IdempotentConsumer) -> datetime | None:
    """The last occurrence the job finished (every item acknowledged or parked); None before
    its first. StoreUnavailable when it cannot be read: the run fails and is tried again."""
    found = consumer.store.read_entities(_cursor(consumer), "completed", 1)
    return datetime.strptime(str(found[0].data["occurrence"]), _STAMP).replace(tzinfo=UTC) if found else None


def complete(consumer: IdempotentConsumer, when: datetime) -> None:
    """Record ``when`` as finished. Two instances may write it in either order: a cursor moved
    back only makes a later run meet the markers of what was done."""
    consumer.store.put_entity(_cursor(consumer), Entity("completed", {"occurrence": f"{when:{_STAMP}}"}))


def pending(consumer: IdempotentConsumer, now: datetime, every: timedelta, at: timedelta = timedelta(0), *,
            catch_up: int = CATCH_UP) -> list[datetime]:  # fmt: skip
    """The occurrences a run at ``now`` does, oldest first: those since the last completed one
    (at most ``catch_up`` before this one; older ones are logged as lost), and this one."""
    current = occurrence(now, every, at)
    last = last_completed(consumer)
    if last is None or last >= current:
        return [current]
    missed = (current - last) // every - 1  # occurrences strictly between the last completed and this one
    if missed > catch_up:  # a job that opted out (catch_up=0: a schedule that skips days) is told less loudly
        log.log(logging.ERROR if catch_up else logging.WARNING, "dedup job %s: %d occurrences after %s are not "
                "caught up (at most %d are): their items were never run", consumer.name, missed - catch_up,
                f"{last:{_STAMP}}", catch_up)  # fmt: skip
    return [current - every * n for n in range(min(missed, catch_up), 0, -1)] + [current]
