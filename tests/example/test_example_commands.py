"""The example's commands (make demo, make chaos, make bench, the smoke test, the cost and
soak tools) answer --help without starting a run; the smoke test without its settings says so
in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from lab.other_triggers import switched_on
from tests.unit.test_entry_points import ROOT, describes_itself


@pytest.mark.parametrize("module", ["lab.demo", "lab.chaos", "lab.bench", "lab.client.smoke", "lab.outbox_cost",
                                    "lab.soak"])  # fmt: skip
def test_help_describes_the_command_and_starts_nothing(module: str) -> None:
    describes_itself(module)


def test_the_smoke_test_without_settings_fails_with_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICEBUS_")}
    done = subprocess.run([sys.executable, "-m", "lab.client.smoke"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" in done.stderr
    )


def test_make_demo_as_a_user_runs_it_reports_figures_that_add_up() -> None:
    """`make demo`'s program in a new process from the repository's root: exit 0, every
    delivery with one outcome, the refused deliveries those of the dead-lettered messages, and
    only the functions the app has (a recipe that is off is said to be off)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEDUP_", "COSMOS_", "DEMO_"))}
    done = subprocess.run([sys.executable, "-m", "lab.demo"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"^Outcomes of the (\d+) deliveries: (.+)\.$", done.stdout, re.MULTILINE)
    assert found, done.stdout
    outcomes = {name: int(count) for name, count in (part.rsplit(" ", 1) for part in found.group(2).split(", "))}
    assert "failed" not in found.group(2) and sum(outcomes.values()) == int(found.group(1))
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["deliveries"] == int(found.group(1)) and last["double_effects"] == last["lost"] == 0
    refused = outcomes.get("invalid", 0) + outcomes.get("conflict", 0)
    assert f"{last['dead_lettered']} messages dead-lettered with a reason (the {refused} invalid" in done.stdout
    api_line = next(line for line in done.stdout.splitlines() if line.startswith("POST /api/orders:"))
    assert ("off" in api_line) == ("orders_api" not in switched_on()), api_line
