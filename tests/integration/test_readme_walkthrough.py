"""Every walkthrough of the docs (lab.adopters.WALKTHROUGHS: the README's "Start your own
app", docs/triggers.md's Event Grid consumer, Storage queue consumer and HTTP route) followed
literally: every block of the section is applied to a copy of the repository (new files
written, diffs applied, names added to infra's lists, the emulator's queue added), then the
copy indexes the new function with its settings documented and deployed, passes the delivery
checks, the policies, lint, format and type checks, and runs the section's tests against a real
Azurite. A block that no longer applies fails here. In an app that followed a walkthrough
already, its blocks are found applied and the rest runs the same; in an app with a consumer of
its own under the walkthrough's name, the walkthrough is followed under another name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab import adopters

pytestmark = pytest.mark.long("each walkthrough applied to a copy of the repository, whose suites then run")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Start your own app"
INDEXED = ("import json, sys, function_app; print(json.dumps([json.loads(b) for f in function_app.app.get_functions() "
           "if f.get_function_name() == sys.argv[1] for b in f.get_raw_bindings()]))")  # fmt: skip


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The repository as a fresh clone has it (tracked and new files), lab/node_modules linked."""
    return adopters.copy_tree(tmp_path, linked=("lab/node_modules",))


def run(copy: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEDUP_", "COSMOS_"))}
    done = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def follow(copy: Path, page: str, title: str) -> tuple[str, list[str]]:
    """Every block of the walkthrough applied to the copy; the name of its consumer and the files
    it wrote."""
    blocks = adopters.walkthrough_for(copy, page, title)
    assert blocks, f"{page}: {title} has no block naming a file"
    for block in blocks:
        adopters.apply(copy, *block)  # NotApplicable here is a failure: the walkthrough must apply
    written = [path for language, path, _ in blocks if language == "python"]
    [module] = [path for path in written if path.startswith("consumers/")]
    return Path(module).stem, written


@pytest.mark.parametrize(("page", "title"), adopters.WALKTHROUGHS, ids=[t[3:] for _, t in adopters.WALKTHROUGHS])
def test_a_walkthrough_adds_a_working_consumer(copy: Path, page: str, title: str) -> None:
    name, written = follow(copy, page, title)
    bindings = json.loads(run(copy, "-c", INDEXED, name).splitlines()[-1])
    assert bindings, f"function_app indexes no function {name!r} after {title}"
    settings = json.loads((copy / "local.settings.json.example").read_text())["Values"]
    bicep = (copy / "infra/main.bicep").read_text()
    for setting in re.findall(r"%(\w+)%", json.dumps(bindings)):  # what the binding reads, documented and deployed
        assert setting in settings and re.search(rf"^\s+{setting}: ", bicep, re.MULTILINE), setting

    for check in ("leases", "retention"):
        said = run(copy, "-m", "lab.delivery_checks", check)  # each deployment's values judged
        assert "\nOK:" in said and "FAIL" not in said, said
    policies = run(copy, "-m", "lab.infra_checks", "policies")
    assert "0 policy violations" in policies, policies
    tests = [path for path in written if path.startswith("tests/")]
    outcome = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests).splitlines()[-1]
    assert " passed" in outcome and "skipped" not in outcome, outcome
    # What make lint and make typecheck run over the app, now with the new consumer in it.
    run(copy, "-m", "ruff", "check", "consumers", *tests)
    run(copy, "-m", "ruff", "format", "--check", *written)
    run(copy, "-m", "mypy", "consumers", "function_app.py")
    if os.environ.get("FUNCTIONS_PYTHON_WORKER"):  # .ci/run sets it: the real worker indexes the new function
        if (ROOT / ".runtime").exists():  # the built worker and packages, reused (content-addressed)
            (copy / ".runtime").symlink_to(ROOT / ".runtime")
        worker = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/runtime/test_python_worker.py",
                     "-k", "indexes_and_loads or apps_bindings_name")  # fmt: skip
        assert "4 passed" in worker, worker


@pytest.mark.parametrize(("page", "title"), adopters.WALKTHROUGHS, ids=[t[3:] for _, t in adopters.WALKTHROUGHS])
def test_a_consumer_of_the_apps_own_under_a_walkthroughs_name_leaves_it_followed_under_another(
    copy: Path, page: str, title: str
) -> None:
    """The app's own consumer takes the walkthrough's name (its module, and the name in infra's
    lists): the walkthrough is followed under the next free name, and the app's file is kept."""
    [taken] = [Path(p).stem for language, p, _ in adopters.walkthrough(copy / page, title)
               if language == "python" and p.startswith("consumers/")]  # fmt: skip
    own = f'"""The app\'s own {taken}."""\n\nimport azure.functions as func\n\nbp = func.Blueprint()\n'
    (copy / "consumers" / f"{taken}.py").write_text(own)
    name, written = follow(copy, page, title)
    assert name == f"{taken}2" and f"consumers/{taken}2.py" in written
    assert (copy / "consumers" / f"{taken}.py").read_text() == own
    assert json.loads(run(copy, "-c", INDEXED, name).splitlines()[-1])
    tests = [path for path in written if path.startswith("tests/")]
    outcome = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests).splitlines()[-1]
    assert " passed" in outcome and "skipped" not in outcome, outcome


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
    name, written = follow(copy, "README.md", SECTION)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    adopters.switch_every_recipe_off(copy)
    removed = make(copy, "remove-example")
    assert "infra/modules/servicebus.bicep" in removed and "README.md" in removed, removed  # what is left to edit
    for gone in ("consumers/orders.py", "consumers/order_events.py", "recipes", "tests/example", "lab/bench"):
        assert not (copy / gone).exists(), gone
    consumers = {p.name for p in (copy / "consumers").glob("*.py")}
    assert f"{name}.py" in consumers and not {"orders.py", "order_events.py"} & consumers
    infra = "".join(p.read_text() for p in [copy / "azure.yaml", *(copy / "infra").rglob("*.bicep")])
    assert "'order_events'" not in infra and "order_events function" not in infra
    make(copy, "lint", "typecheck", "check-retention", "check-leases")
    collected = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only")
    assert "error" not in collected.splitlines()[-1], collected[-3000:]
    assert "tests/integration/test_queue_function.py" in collected and "tests/example" not in collected
    tests = [p for p in written if p.startswith("tests/")]
    fast = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit", *tests,
               "tests/integration/test_telemetry.py")  # fmt: skip
    assert " passed" in fast.splitlines()[-1] and "failed" not in fast.splitlines()[-1], fast[-2000:]
