"""Sessions under fire (lab/sessions.py): the order_status consumer on a session queue —
each order's versions applied in order, none twice, through store faults, abandons and lost
session locks; and the twin without sessions, where versions arrive out of order (stale)."""

from __future__ import annotations

from lab.sessions import SessionConfig, run_sessions
from shared.idempotency.testing.azurite import Azurite


def test_a_session_per_order_applies_its_versions_in_order(azurite: Azurite) -> None:
    report = run_sessions(SessionConfig(orders=30, seed=5), azurite)
    assert report.ok, report.violations
    assert report.outcomes["stale"] == 0 and report.wrong_final == 0 and report.dead_lettered == 0
    assert sum(report.faults.values()) > 0 and report.messages > 30 * 5  # producer retries too


def test_without_sessions_the_checker_sees_versions_out_of_order(azurite: Azurite) -> None:
    report = run_sessions(SessionConfig(orders=30, seed=5, sessions=False), azurite)
    assert report.outcomes["stale"] > 0 and not report.ok
