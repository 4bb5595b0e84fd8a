"""A step owner that dies after its call, or cannot complete the step, is recovered by a
redelivery inside the broker's delivery budget — at the shipped proportions (lock duration,
maxDeliveryCount, DEDUP_LEASE, DEDUP_IN_FLIGHT_WAIT from infra/ and the defaults, scaled in
time so that the lock lasts 2 s), through the peek-lock broker, with a real payment API, on the
library tests' `items` function (tests/app.py)."""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from lab.harness import Report, RunConfig, Timing, run
from shared.idempotency.downstream import IdempotentHttp
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.stores import Commit, CommitResult, Marker, TableStore
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash
from tests.targets import ITEMS

pytestmark = pytest.mark.long("a broker's whole delivery budget played out, in scaled time")


@pytest.fixture
def azurite_on_disk() -> Iterator[Azurite]:
    with tempfile.TemporaryDirectory(prefix="budget-") as data, Azurite(location=Path(data)) as azurite:
        yield azurite


def config(**changes: Any) -> RunConfig:
    """Every message charged through the payment API; no duplicates, faults or bad input,
    so that each injected failure is the only thing that happens to its message."""
    settings: dict[str, Any] = {
        "messages": 24,
        "workers": 4,
        "dup_rate": 0.0,
        "fault_rate": 0.0,
        "mismatch_rate": 0.0,
        "invalid_rate": 0.0,
        "seed": 3,
        "payments": True,
        "table": "b" + uuid.uuid4().hex[:12],
    }
    return RunConfig(**{**settings, **changes})


class FirstTimeOnly:
    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._mutex = threading.Lock()

    def first(self, key: str) -> bool:
        with self._mutex:
            new = key not in self.seen
            self.seen.add(key)
            return new


def assert_recovered(report: Report) -> None:
    assert report.violations == [] and (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.payment_charges == report.effects_applied == report.messages == 24
    assert report.dead_lettered == 0 and report.broker_dead_lettered == 0 and report.resubmitted == 0


def test_the_shipped_timing_is_the_azure_proportions() -> None:
    timing = Timing.of(RunConfig(lock_duration=2.0))
    # lock 1 min -> 2 s; DEDUP_LEASE 1 min -> 2 s; DEDUP_IN_FLIGHT_WAIT 10 s -> 1/3 s; 10 deliveries;
    # DEDUP_TRANSIENT_WAIT 2 min -> 4 s; the host's lock renewal 5 min -> 10 s
    assert (timing.max_deliveries, timing.lease, round(timing.in_flight_wait, 3)) == (10, 2.0, 0.333)
    assert (round(timing.transient_wait, 3), round(timing.lock_renewal, 3)) == (4.0, 10.0)


@pytest.fixture
def crashed(monkeypatch: pytest.MonkeyPatch) -> FirstTimeOnly:
    """Each step owner dies right after its first payment call returned (the charge made)."""
    first_calls = FirstTimeOnly()
    post = IdempotentHttp.post

    def charge_then_die(self: IdempotentHttp, path: str, body: Any, idempotency_key: str) -> Any:
        answer = post(self, path, body, idempotency_key)
        if first_calls.first(idempotency_key):
            raise Crash("the worker died after the payment API charged")
        return answer

    monkeypatch.setattr(IdempotentHttp, "post", charge_then_die)
    return first_calls


def test_a_worker_that_dies_after_the_call_is_recovered_by_a_redelivery(
    azurite_on_disk: Azurite, crashed: FirstTimeOnly
) -> None:
    report = run(config(), azurite_on_disk, ITEMS)
    assert len(crashed.seen) == 24
    assert_recovered(report)


class CompletionFailsOnce(TableStore):
    """The store fails (after the SDK's retries) the first time each step completes: the
    first commit carrying its completion, and its own completion written after that."""

    failed = FirstTimeOnly()
    failed_alone = FirstTimeOnly()

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        steps = [str(step.key) for commit in commits for step in commit.completions]
        if [key for key in steps if self.failed.first(key)]:
            raise StoreUnavailable("503 injected at the commit completing a step")
        return super().commit_many(commits)

    def replace(self, marker: Marker, if_version: str) -> Marker:
        if marker.final and self.failed_alone.first(str(marker.key)):
            raise StoreUnavailable("503 injected at completion")
        return super().replace(marker, if_version)


def test_a_step_that_cannot_complete_is_recovered_by_a_redelivery(azurite_on_disk: Azurite) -> None:
    CompletionFailsOnce.failed, CompletionFailsOnce.failed_alone = FirstTimeOnly(), FirstTimeOnly()
    report = run(config(), azurite_on_disk, ITEMS, break_store=CompletionFailsOnce)
    assert len(CompletionFailsOnce.failed.seen) == 24
    assert_recovered(report)


def test_without_waiting_the_old_lease_ran_out_of_deliveries_and_only_an_operator_recovered(
    azurite_on_disk: Azurite, crashed: FirstTimeOnly
) -> None:
    """Why deliveries wait: with DEDUP_TRANSIENT_WAIT=0 and the old lease (functionTimeout +
    30 s: 330 s, here 11 s), the ten deliveries ran out while a dead owner's claim was still
    leased. The harness sees it (messages left in the broker's DLQ), and counts apart what
    an operator's resubmission then recovered."""
    report = run(
        config(messages=8, lease=2.0 * 330 / 60, transient_wait=0.0, resubmit_rounds=5), azurite_on_disk, ITEMS
    )
    assert report.resubmitted >= 8  # every message went to the broker's DLQ at least once
    assert (report.double_effects, report.lost) == (0, 0) and report.payment_charges == 8
