"""Timers: ``on_schedule``, each item of an occurrence once (``shared.idempotency.jobs``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from ..jobs import CATCH_UP, complete, pending, run_job
from ..messages import Outcome, Result, utcnow
from ..reasons import Reason
from ._settle import Consumer, RetryLater, retries_left, settle_or_park

log = logging.getLogger("idempotency")


def on_schedule(consumer: Consumer, every: timedelta, at: timedelta,
                items: Callable[[datetime], Iterable[tuple[str, Any]]], context: Any = None, *,
                catch_up: int = CATCH_UP) -> None:  # fmt: skip
    """Run a timer's occurrence: each (id, item) that ``items(occurrence)`` returns, once per
    occurrence (``shared.idempotency.jobs``), after the occurrences since the last completed
    one that no run finished (at most ``catch_up``). An item still failing raises while the
    timer's retry policy has tries left (the occurrences run again; what was done is not done
    twice); on the last try it is parked for ``python -m shared.idempotency.replay``, and the
    occurrence counts as completed. A run that cannot even park leaves it to the next run."""
    built = consumer()
    due = pending(built, utcnow(), every, at, catch_up=catch_up)
    runs, unlisted = [], []
    for when in due:
        try:
            listed = list(items(when))
        except Exception:  # one occurrence's items never stop the others'
            log.exception("dedup job %s: the items of %s could not be listed", built.name, when)
            unlisted.append(when)
            continue
        runs.append(run_job(built, when, listed))
    settle_or_park(built, [(d, r) for run in runs for d, r in zip(run.deliveries, run.results, strict=True)
                           if not r.acknowledge], context)  # fmt: skip
    if unlisted and retries_left(context):
        raise RetryLater(Result(Outcome.TRANSIENT, None, Reason.ITEMS_FAILED, f"{len(unlisted)} occurrence(s)"))
    done = [when for when in due if when < min(unlisted, default=due[-1] + every)]  # the next run tries the rest
    if done:
        complete(built, done[-1])
