"""Event Hubs under fire (lab/eventhub.py): checkpoints after every batch, success or not,
replays after crashes, rebalances, producer retries, store faults and events that keep failing
past the retry policy — every event applied once, directly or by the operator's replay of what
was parked; and the checker sees a consumer that drops what it should park."""

from __future__ import annotations

import pytest

from lab.eventhub import StreamConfig, run_stream
from shared.idempotency import IdempotentConsumer
from shared.idempotency.messages import Delivery, Outcome, Result
from shared.idempotency.testing.azurite import Azurite


def test_every_event_is_applied_once_through_replays_rebalances_and_parking(azurite: Azurite) -> None:
    report = run_stream(StreamConfig(events=200, seed=7), azurite)
    assert report.ok, report.violations
    assert (report.lost, report.double) == (0, 0)
    assert report.sent > report.logical  # producer retries: new events, the same producer ids
    assert report.replays > 0 and report.rebalances > 0 and report.parked > 0
    assert report.replayed_by_operator == report.parked and sum(report.faults.values()) > 0


def test_the_checker_sees_events_dropped_instead_of_parked(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    def drop(self: IdempotentConsumer, failing: list[tuple[Delivery, Result]]) -> list[Result]:
        return [Result(Outcome.PARKED, result.key) for _, result in failing]  # acknowledged, never recorded

    monkeypatch.setattr(IdempotentConsumer, "park", drop)
    report = run_stream(StreamConfig(events=200, seed=7), azurite)
    assert report.lost > 0 and report.parked == 0
