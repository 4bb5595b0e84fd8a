"""The operators' tools on the example app, in a fresh process from its root: they find the
example's consumers (the default ``consumers`` package) and those of the recipes switched on
(moved into consumers/, as ``make recipe`` does). The tools themselves are proven on the
library tests' consumers: tests/integration/test_operator_commands.py."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

import recipes
from shared.idempotency.functions import shared_store
from shared.idempotency.functions.registry import declared
from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app
from tests.integration.operators import ROOT, run_tool
from tests.integration.test_operator_commands import TOOLS


def run_switched_on(*argv: str, switched_on: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``run_tool`` from a copy of the app's root whose consumers/ holds the recipes' modules
    ``switched_on`` too."""
    if not switched_on:
        return run_tool(*argv)
    with tempfile.TemporaryDirectory(prefix="app-") as folder:
        root = Path(folder)
        shutil.copytree(ROOT / "consumers", root / "consumers", ignore=shutil.ignore_patterns("__pycache__"))
        for name in switched_on:  # from recipes/, or consumers/ once switched on (copied already)
            shutil.copy(str(recipes.module(name).__file__), root / "consumers")
        return run_tool(*argv, root=root)


@pytest.mark.parametrize("switched_on", [[], sorted(recipes.MODULES.values())], ids=["default", "every recipe"])
def test_an_unknown_consumer_in_a_fresh_process_lists_every_consumer_of_the_app(
    azurite: Azurite, switched_on: list[str]
) -> None:
    """Nothing imported the consumers' modules before: the tools import them themselves."""
    with fresh_app(azurite):
        shared_store()  # the app's tables, as the app creates them (a command never does)
        modules = ["consumers", *(recipes.module(name).__name__ for name in switched_on)]
        expected = {c.name for module in modules for c in declared(module)}
        assert {"orders", "order-events"} <= expected
        for tool in sorted(TOOLS - {"shared.idempotency.housekeeping"}):  # the one that takes no consumer
            ids = ["--ids", "o-1"] if tool.endswith("resubmit") else []
            done = run_switched_on(tool, "--consumer", "nosuch", *ids, switched_on=switched_on)
            assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
            known = set(done.stderr.split("known: ")[1].strip().split(", "))
            assert known == expected, done.stderr  # the app's, whichever they are
