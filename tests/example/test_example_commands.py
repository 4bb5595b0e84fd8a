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

RUNS_IN_FULL = pytest.mark.long("a whole run as a user types it (seconds of deliveries against Azurite)")


@pytest.mark.parametrize("module", ["lab.demo", "lab.chaos", "lab.bench", "lab.client.smoke", "lab.outbox_cost",
                                    "lab.soak", "lab.queue_chaos", "lab.blob_import_run"])  # fmt: skip
def test_help_describes_the_command_and_starts_nothing(module: str) -> None:
    describes_itself(module)


def test_the_smoke_test_without_settings_fails_with_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVICEBUS_")}
    done = subprocess.run([sys.executable, "-m", "lab.client.smoke"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" in done.stderr
    )


@RUNS_IN_FULL
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
    audit = re.search(r"^Audit: received (\d+) = processed (\d+) .* unaccounted 0;", done.stdout, re.MULTILINE)
    assert audit and int(audit[1]) >= int(audit[2]) > 0, done.stdout  # every sequence number accounted for
    api_line = next(line for line in done.stdout.splitlines() if line.startswith("POST /api/orders:"))
    assert ("off" in api_line) == ("orders_api" not in switched_on()), api_line


@RUNS_IN_FULL
def test_the_blob_import_run_as_docs_triggers_md_gives_it_applies_each_record_once() -> None:
    """`python -m lab.blob_import_run` in a new process from the repository's root, on a smaller
    file: exit 0, one JSON line, each record applied once per content through a crash mid-file,
    a duplicate event, a re-upload and a corrected file, well under 0.1 store request a record."""
    done = subprocess.run([sys.executable, "-m", "lab.blob_import_run", "--records", "1200", "--changed", "12"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["applied"], report["crashes"], report["invocations"]) == (1200 + 12, 1, 5), report
    assert report["steps"]["the event again"]["requests"] == report["steps"]["the same content uploaded again"][
        "requests"] == 1  # fmt: skip
    assert report["requests_per_record"] < 0.1, report


@pytest.mark.parametrize("setting", ["CHAOS_MESSAGES=many", "CHAOS_DUP_RATE=2", "CHAOS_SEED=x",
                                     "CHAOS_STREAM_EVENTS=1e3", "BALANCES_STORES=table-lean,tabel-sdk"])  # fmt: skip
def test_make_chaos_with_a_bad_setting_says_which_in_one_line_before_running(setting: str) -> None:
    """Every setting is read before the first section starts: a bad one is the run's verdict
    (exit 2, one line naming it), never a traceback minutes in."""
    name, value = setting.split("=", 1)
    done = subprocess.run([sys.executable, "-m", "lab.chaos"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, name: value}, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert name in done.stderr
