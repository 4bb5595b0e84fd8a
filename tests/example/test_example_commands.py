"""The example's commands (make demo, make chaos, make bench, the smoke test, the cost and
soak tools) answer --help without starting a run; the smoke test without its settings says so
in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.test_entry_points import ROOT, describes_itself


@pytest.mark.parametrize("module", ["tools.demo", "tools.chaos", "bench", "client.smoke", "tools.outbox_cost",
                                    "tools.soak"])  # fmt: skip
def test_help_describes_the_command_and_starts_nothing(module: str) -> None:
    describes_itself(module)


def test_the_smoke_test_without_settings_fails_with_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICEBUS_")}
    done = subprocess.run([sys.executable, "-m", "client.smoke"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" in done.stderr
    )
