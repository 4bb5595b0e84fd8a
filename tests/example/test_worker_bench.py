"""lab/bench/worker.py, run small: both functions of the bench app, in the real Python worker,
processed every message once (exact counts read back from Azurite). Throughput is not judged
here (64 messages say nothing); `python -m lab.bench.worker` is the measurement.

Runs when FUNCTIONS_PYTHON_WORKER names the release or `make worker` fetched it; skips
otherwise, and never skips when the variable is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.bench import worker
from lab.runtime import build

pytestmark = pytest.mark.long("the bench's own runs")

MESSAGES = 64


def test_both_functions_process_every_message_exactly_once() -> None:
    if build.configured() is None:
        pytest.skip(f"set {build.SOURCE_SETTING} to the worker release {build.RELEASE} archive, or run `make worker`")
    result = worker.measure(MESSAGES, concurrency=16, rounds=1)
    assert "skipped" not in result
    assert result["failed_invocations"] == 0, result["first_failures"]
    assert result["violations"] == 0, result
    sent = 2 * MESSAGES  # the untimed warm-up, then one timed round
    for name in ("dedup", "plain"):
        side = result[name]
        assert side["timed_messages"] == MESSAGES, name
        assert side["sent"] == side["succeeded"] == side["stored_orders"] == side["stored_postings"] == sent, side
    assert (result["dedup"]["markers"], result["plain"]["markers"]) == (sent, 0)
    assert result["dedup"]["store_requests_per_message"] >= 1.0  # the commit: marker and effects together
    assert [ok for name, ok in result["target"].items() if "store request" in name] == [True]  # within its bound
    assert result["plain"]["store_requests_per_message"] == 1.0
    assert result["dedup_per_s"] > 0 and result["plain_per_s"] > 0 and result["ratio"] > 0


def test_without_a_worker_release_it_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make bench` reports the skip instead of failing."""
    monkeypatch.setattr(build, "configured", lambda: None)
    result = worker.measure(8, rounds=1)
    assert set(result) == {"skipped"} and build.SOURCE_SETTING in result["skipped"]
    assert worker.main(["--messages", "8", "--rounds", "1"]) == 0


def test_a_worker_setting_naming_nothing_fails_loudly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(build.SOURCE_SETTING, str(tmp_path / "missing.tar.gz"))
    with pytest.raises(FileNotFoundError):
        worker.measure(8, rounds=1)
