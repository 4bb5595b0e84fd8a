"""Operators' tools run as operators run them: ``python -m <tool> …`` in a new process,
from the app's root, the app settings in its environment (here: those the test set, e.g.
with ``fresh_app``). Nothing the test process imported or built is shared with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tool(*argv: str, python: Sequence[str] = (), switched_on: Sequence[str] = (),
             **settings: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m argv…`` from the app's root (``python``: what replaces ``-m``, e.g.
    ``["-c", code]``); ``settings`` over this process's environment. ``switched_on``: recipes'
    modules the app has moved into consumers/ (as ``make recipe`` does): the tool then runs
    from a copy of the app's root whose consumers/ holds them too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with tempfile.TemporaryDirectory(prefix="app-") as folder:
        root = ROOT
        if switched_on:
            root = Path(folder)
            shutil.copytree(ROOT / "consumers", root / "consumers", ignore=shutil.ignore_patterns("__pycache__"))
            for name in switched_on:
                shutil.copy(ROOT / "recipes" / f"{name}.py", root / "consumers")
            env["PYTHONPATH"] = str(ROOT)  # the library and the rest of the app; consumers/ from the copy
        return subprocess.run([sys.executable, *(python or ["-m"]), *argv], cwd=root, env={**env, **settings},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
