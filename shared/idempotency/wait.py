"""The in-delivery wait: what clears by itself (``reasons.WAITED_OUT``: a store outage, a
step claimed elsewhere, a send that failed) is tried again inside the same delivery, with
growing, jittered pauses, until the delivery's wait runs out; what still fails then goes
back to its source with its reason."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from .messages import RETRY_OUTCOMES, Result
from .reasons import WAITED_OUT

# Pauses between attempts, as shares of the delivery's wait (2 min: 0.2 s doubling up to 5 s),
# with jitter; scaled so that a shorter wait (Event Grid, HTTP, a scaled test) keeps its attempts.
FIRST_PAUSE, MAX_PAUSE = 1 / 600, 1 / 24

Attempt = Callable[[Sequence[int], bool], list[Result]]
"""Attempts the deliveries at these positions (``True``: a retry), a result for each."""


def within(wait: timedelta, count: int, attempt: Attempt) -> list[Result]:
    """Every delivery attempted once, then those that failed in a way that clears by itself
    again, while one more attempt (as slow as the slowest so far) still ends in ``wait``."""
    deadline = time.monotonic() + wait.total_seconds()  # the first attempt counts too
    started = time.monotonic()
    results = attempt(range(count), False)
    slowest = time.monotonic() - started
    pause, cap = wait.total_seconds() * FIRST_PAUSE, wait.total_seconds() * MAX_PAUSE
    while True:
        again = [i for i, r in enumerate(results) if r.outcome in RETRY_OUTCOMES and r.reason in WAITED_OUT]
        nap = random.uniform(pause / 2, pause)  # jitter: instances do not retry in step
        if not again or time.monotonic() + nap + slowest > deadline:
            return results
        time.sleep(nap)
        pause = min(pause * 2, cap)
        started = time.monotonic()
        for i, result in zip(again, attempt(again, True), strict=True):
            results[i] = result
        slowest = max(slowest, time.monotonic() - started)
