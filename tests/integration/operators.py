"""Operators' tools run as operators run them: ``python -m <tool> …`` in a new process,
from the app's root, the app settings in its environment (here: those the test set, e.g.
with ``fresh_app``). Nothing the test process imported or built is shared with it; the
library's tests name their consumers' module with ``--consumers tests.app``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tool(
    *argv: str, python: Sequence[str] = (), root: Path = ROOT, **settings: str
) -> subprocess.CompletedProcess[str]:
    """``python -m argv…`` from the app's root (``python``: what replaces ``-m``, e.g.
    ``["-c", code]``; ``root``: another copy of the app); ``settings`` over this process's
    environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if root != ROOT:
        env["PYTHONPATH"] = str(ROOT)  # the library and the rest of the app; consumers/ from the copy
    return subprocess.run([sys.executable, *(python or ["-m"]), *argv], cwd=root, env={**env, **settings},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
