"""Switching a recipe on and off as recipes/README.md writes it: ``make recipe NAME=<name>`` in
a fresh copy of the template moves its module into consumers/ and names it in
infra/recipes.json; the app then registers its functions (and the housekeeping they need), and
nothing else changes; ``make recipe-off NAME=<name>`` undoes both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import recipes
from lab.adopters import copy_tree
from tests.integration.operators import ROOT

LIST_FUNCTIONS = (
    "import json, function_app\n"
    "print(json.dumps(sorted(f.get_function_name() for f in function_app.app.get_functions())))"
)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """The template as a fresh clone has it (with what is not committed yet, committed there),
    its dependencies the ones installed here."""
    app = copy_tree(tmp_path / "app", linked=(".venv",))
    (app / "lab" / "node_modules").mkdir(parents=True)  # the recipe needs no npm tool: installed, as far as make knows
    for stamp in (ROOT / ".venv" / ".installed", app / "lab" / "node_modules" / ".installed"):
        stamp.touch()
    return app


def run(app: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(list(argv), cwd=app, env=env, capture_output=True, text=True, timeout=300)


def functions(app: Path) -> list[str]:
    done = run(app, sys.executable, "-c", LIST_FUNCTIONS)
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_make_recipe_switches_a_recipe_off_and_on(template: Path) -> None:
    """Off, then on again, whatever the template had: the module and the name move together."""
    off = run(template, "make", "--no-print-directory", "recipe-off", "NAME=eventhubs")
    assert off.returncode == 0, off.stderr
    assert (template / "recipes" / "shipments.py").exists() and not (template / "consumers" / "shipments.py").exists()
    assert "eventhubs" not in json.loads((template / "infra" / "recipes.json").read_text())
    before = functions(template)
    assert "shipment_tracking" not in before
    names = json.loads((template / "infra" / "recipes.json").read_text())
    done = run(template, "make", "--no-print-directory", "recipe", "NAME=eventhubs")
    assert done.returncode == 0, done.stderr
    assert (template / "consumers" / "shipments.py").exists() and not (template / "recipes" / "shipments.py").exists()
    assert json.loads((template / "infra" / "recipes.json").read_text()) == sorted([*names, "eventhubs"])
    assert sorted(functions(template)) == sorted([*before, "shipment_tracking"])
    again = run(template, "make", "--no-print-directory", "recipe", "NAME=eventhubs")
    assert again.returncode == 0 and "on already" in again.stdout
    tracked = run(template, "git", "ls-files", "consumers/shipments.py", "recipes/shipments.py").stdout
    assert tracked == "consumers/shipments.py\n"  # moved as git moves a file (git mv): its history follows
    off = run(template, "make", "--no-print-directory", "recipe-off", "NAME=eventhubs")
    assert off.returncode == 0 and json.loads((template / "infra" / "recipes.json").read_text()) == names
    assert sorted(functions(template)) == sorted(before)


def test_a_feature_recipe_is_named_for_infra_and_switched_on_by_its_setting(template: Path) -> None:
    run(template, "make", "--no-print-directory", "recipe-off", "NAME=outbox")
    done = run(template, "make", "--no-print-directory", "recipe", "NAME=outbox")
    assert done.returncode == 0 and "set ORDER_ACCEPTED_TOPIC" in done.stdout, done.stderr
    assert "outbox" in json.loads((template / "infra" / "recipes.json").read_text())
    (template / "function_app.py").touch()
    env_run = subprocess.run([sys.executable, "-c", LIST_FUNCTIONS], cwd=template, capture_output=True, text=True,
                             env={**os.environ, "ORDER_ACCEPTED_TOPIC": "order-events"}, timeout=120)  # fmt: skip
    assert "dispatch_outbox" in env_run.stdout, env_run.stderr
    off = run(template, "make", "--no-print-directory", "recipe-off", "NAME=outbox")
    assert off.returncode == 0 and "remove ORDER_ACCEPTED_TOPIC" in off.stdout, off.stdout
    assert "outbox" not in json.loads((template / "infra" / "recipes.json").read_text())


def test_the_example_is_not_removed_under_a_recipe_switched_on(template: Path) -> None:
    """A recipe on (its module in consumers/, its name in infra/recipes.json) uses the example's
    domain: removing it would break the app, so make refuses in one line naming both and how to
    switch them off, and deletes nothing."""
    assert run(template, "make", "--no-print-directory", "recipe", "NAME=http").returncode == 0
    done = run(template, "make", "--no-print-directory", "remove-example")
    assert done.returncode == 2 and done.stderr.startswith("make remove-example: switch the recipes off first")
    assert "make recipe-off NAME=" in done.stderr and '"http"' in done.stderr, done.stderr
    assert "consumers/orders_api.py" in done.stderr, done.stderr
    assert (template / "consumers" / "orders.py").is_file() and (template / "consumers" / "order_events.py").is_file()
    assert (template / "recipes").is_dir() and (template / "lab" / "order_effects.py").is_file()


def test_an_unknown_recipe_is_one_line_and_changes_nothing(template: Path) -> None:
    done = run(template, sys.executable, "-m", "lab.recipe", "nosuch")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "choose from" in done.stderr
    assert run(template, "git", "status", "--porcelain", "--", "consumers", "recipes", "infra").stdout == ""


def test_every_recipe_is_listed_with_its_module() -> None:
    listed = (ROOT / "recipes" / "README.md").read_text()
    for name, module in recipes.MODULES.items():
        assert f"| `{name}` | `{module}.py` |" in listed
        assert recipes.module(module).bp is not None
    for name in recipes.FEATURES:
        assert f"| `{name}` | (the orders consumers) |" in listed
