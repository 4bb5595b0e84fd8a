"""orders → order-events → billing + shipping under faults at every hop (lab/chain.py): one
order record, one invoice and one pick list per order, nothing left unsent, nothing in a
broker's dead-letter queue — and the checker sees a consumer that forgets to re-send."""

from __future__ import annotations

import pytest

from lab.chain import SEND_FAULTS, ChainConfig, run_chain
from shared.idempotency import Outcome
from shared.idempotency.testing.azurite import Azurite

pytestmark = pytest.mark.long("hundreds of messages under faults")


def test_every_order_is_billed_and_shipped_once_whatever_fails(azurite: Azurite) -> None:
    report = run_chain(ChainConfig(messages=300, seed=11), azurite)
    assert report.ok, report.violations
    assert (report.lost, report.double, report.left_in_outbox, report.broker_dead_lettered) == (0, 0, 0, 0)
    assert all(report.faults[kind] > 0 for kind in (*SEND_FAULTS, "crash_after_commit", "lost_ack")), report.faults
    assert report.dropped_by_detection > 0  # re-sends with the same MessageId, dropped by the topic
    assert report.sent_to_topic >= report.orders == 300


def test_the_checker_sees_a_consumer_that_never_re_sends(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect the outbox exists for: a duplicate that does not send what is left."""
    monkeypatch.setattr("shared.idempotency.consumer._COMMITTED", frozenset({Outcome.PROCESSED}))
    report = run_chain(ChainConfig(messages=150, seed=11, send_fault_rate=0.3), azurite)
    assert report.lost > 0 and report.left_in_outbox > 0
    assert any("never sent" in v for v in report.violations)
