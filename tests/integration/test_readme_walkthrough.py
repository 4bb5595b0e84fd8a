"""The README's "Start your own app", and docs/triggers.md's "Add an Event Grid consumer",
followed literally: every block of the section is applied to a copy of the repository (new
files written, diffs applied, the emulator's queue added), then the copy indexes the new
function, passes the delivery checks, lint and format checks, and runs the section's test
against a real Azurite. A block that no longer applies fails here; in an app that followed a
walkthrough already, its blocks are found applied and the rest runs the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab import adopters

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Start your own app"
TRIGGERS = ROOT / "docs" / "triggers.md"  # the second walkthrough, a CloudEvents consumer
INDEXED = ("import json, function_app; print(json.dumps([json.loads(f.get_raw_bindings()[0]) "
           "for f in function_app.app.get_functions() if f.get_function_name() == 'invoices']))")  # fmt: skip


def walkthrough(title: str = SECTION, page: Path = README) -> list[tuple[str, str, str]]:
    """(language, file, text) of every fenced block that names a file, in order."""
    return adopters.walkthrough(page, title)


def apply(copy: Path, language: str, path: str, text: str) -> bool:
    """Apply one block to the copy (lab.adopters.apply); False when the copy holds it already —
    an app that followed the walkthrough. A file of the app's own where the walkthrough writes
    one means the walkthrough cannot be followed literally here: skipped, saying so."""
    try:
        return adopters.apply(copy, language, path, text)
    except adopters.NotApplicable as exc:
        pytest.skip(f"{exc}: the walkthrough cannot be applied as written")


def service_bus_entities(copy: Path) -> int:
    """How many Service Bus entities the copy's infra deploys, as make check-leases counts them."""
    report = run(copy, "-m", "lab.delivery_checks", "leases")
    found = re.search(r"(\d+) Service Bus entities", report)
    assert found, report
    return int(found.group(1))


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The repository as a fresh clone has it (tracked and new files), lab/node_modules linked."""
    return adopters.copy_tree(tmp_path, linked=("lab/node_modules",))


def run(copy: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEDUP_", "COSMOS_"))}
    done = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_readme_walkthrough_adds_a_working_consumer(copy: Path) -> None:
    blocks = walkthrough()
    assert [(language, path) for language, path, _ in blocks] == [
        ("python", "consumers/invoices.py"),
        ("python", "tests/test_invoices.py"),
        ("diff", "local.settings.json.example"),
        ("diff", "infra/main.bicep"),
        ("diff", "infra/main.bicep"),
        ("json", "infra/emulator/servicebus-config.json"),
    ]
    entities = service_bus_entities(copy)
    applied = [apply(copy, *block) for block in blocks]
    if all(applied):  # a template that had no invoices queue deploys one more entity, which the checks read
        assert service_bus_entities(copy) == entities + 1

    [trigger] = json.loads(run(copy, "-c", INDEXED).splitlines()[-1])
    assert (trigger["type"], trigger["queueName"], trigger["dataType"]) == ("serviceBusTrigger", "%INVOICES_QUEUE%",
                                                                            "BINARY")  # fmt: skip
    assert json.loads((copy / "local.settings.json.example").read_text())["Values"]["INVOICES_QUEUE"] == "invoices"
    assert "INVOICES_QUEUE: 'invoices'" in (copy / "infra/main.bicep").read_text()

    for check in ("leases", "retention"):
        assert run(copy, "-m", "lab.delivery_checks", check).startswith("OK")
    assert "1 passed" in run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_invoices.py")
    # What make lint and make typecheck run over the app, now with the new consumer in it.
    run(copy, "-m", "ruff", "check", "consumers", "tests/test_invoices.py")
    run(copy, "-m", "ruff", "format", "--check", "consumers/invoices.py", "tests/test_invoices.py")
    run(copy, "-m", "mypy", "consumers", "function_app.py")
    if os.environ.get("FUNCTIONS_PYTHON_WORKER"):  # .ci/run sets it: the real worker indexes the new function
        if (ROOT / ".runtime").exists():  # the built worker and packages, reused (content-addressed)
            (copy / ".runtime").symlink_to(ROOT / ".runtime")
        worker = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/runtime/test_python_worker.py",
                     "-k", "indexes_and_loads or apps_bindings_name")  # fmt: skip
        assert "4 passed" in worker, worker


def test_the_readme_event_grid_walkthrough_adds_a_working_consumer(copy: Path) -> None:
    """The second walkthrough, from the docs alone: a CloudEvents consumer keyed by a field of
    the event's data, its test, and one more call of the subscription module."""
    blocks = walkthrough("## Add an Event Grid consumer", TRIGGERS)
    assert [(language, path) for language, path, _ in blocks] == [
        ("python", "consumers/refunds.py"),
        ("python", "tests/test_refunds.py"),
        ("diff", "infra/main.bicep"),
    ]
    for block in blocks:
        apply(copy, *block)
    indexed = INDEXED.replace("'invoices'", "'refunds'")
    [trigger] = json.loads(run(copy, "-c", indexed).splitlines()[-1])
    assert trigger["type"] == "eventGridTrigger"
    for check in ("leases", "retention"):
        report = run(copy, "-m", "lab.delivery_checks", check)
        assert report.startswith("OK") and "modules/eventgrid-subscription.bicep:subscription[refunds]" in report
    assert "1 passed" in run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_refunds.py")
    run(copy, "-m", "ruff", "check", "consumers", "tests/test_refunds.py")
    run(copy, "-m", "ruff", "format", "--check", "consumers/refunds.py", "tests/test_refunds.py")
    run(copy, "-m", "mypy", "consumers", "function_app.py")
    if os.environ.get("FUNCTIONS_PYTHON_WORKER"):
        if (ROOT / ".runtime").exists():
            (copy / ".runtime").symlink_to(ROOT / ".runtime")
        worker = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/runtime/test_python_worker.py",
                     "-k", "indexes_and_loads or apps_bindings_name")  # fmt: skip
        assert "4 passed" in worker, worker
    policies = run(copy, "-m", "lab.infra_checks", "policies")
    assert "0 policy violations" in policies, policies


def make(copy: Path, *targets: str) -> str:
    done = adopters.make(copy, *targets, timeout=600)
    assert done.returncode == 0, f"make {' '.join(targets)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_without_the_example_the_library_and_its_tests_stand(copy: Path) -> None:
    """The walkthrough's last step: after it, `make remove-example` (every recipe switched off
    first, `make recipe-off`, as its refusal says) leaves the library, its tests and the new
    consumer, and infra deploys nothing for a removed function. Lint, types and the delivery
    checks pass as make test runs them; every remaining test module imports (none of them
    needed the example) and the library's fast tests pass. (The whole suite on such a copy:
    `make test-adopters`, lab/adopters.py.)"""
    section = README.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    assert "`make remove-example`" in section
    for block in walkthrough():
        apply(copy, *block)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    adopters.switch_every_recipe_off(copy)
    removed = make(copy, "remove-example")
    assert "infra/modules/servicebus.bicep" in removed and "README.md" in removed, removed  # what is left to edit
    for gone in ("consumers/orders.py", "consumers/order_events.py", "recipes", "tests/example", "lab/bench"):
        assert not (copy / gone).exists(), gone
    consumers = {p.name for p in (copy / "consumers").glob("*.py")}
    assert "invoices.py" in consumers and not {"orders.py", "order_events.py"} & consumers
    infra = "".join(p.read_text() for p in [copy / "azure.yaml", *(copy / "infra").rglob("*.bicep")])
    assert "'order_events'" not in infra and "order_events function" not in infra
    make(copy, "lint", "typecheck", "check-retention", "check-leases")
    collected = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only")
    assert "error" not in collected.splitlines()[-1], collected[-3000:]
    assert "tests/integration/test_queue_function.py" in collected and "tests/example" not in collected
    fast = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit", "tests/test_invoices.py",
               "tests/integration/test_telemetry.py")  # fmt: skip
    assert " passed" in fast.splitlines()[-1] and "failed" not in fast.splitlines()[-1], fast[-2000:]
