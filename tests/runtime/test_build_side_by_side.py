"""The worker's build in .runtime is shared by whatever runs at once (pytest-xdist's workers,
two `make test`, a copy of the repository whose .runtime is this one): what one build made is
never rewritten under another's running worker."""

from __future__ import annotations

import os
from pathlib import Path

from lab.runtime import build
from tests.runtime.test_python_worker import configured

ROOT = Path(__file__).resolve().parents[2]


def test_an_app_is_a_folder_per_content_written_once() -> None:
    configured()
    plain = build.prepare().app
    marker = plain / "function_app.py"
    written = marker.stat().st_mtime_ns
    other = build.prepare(extra={"side_by_side": ROOT / "tests" / "app.py"}).app
    assert other != plain and (other / "consumers" / "side_by_side.py").exists()
    assert not (plain / "consumers" / "side_by_side.py").exists()
    assert build.prepare().app == plain and marker.stat().st_mtime_ns == written  # found, not rewritten
    assert (plain / build.PACKAGES).resolve() == (other / build.PACKAGES).resolve()  # one install for both


def test_the_host_stubs_are_not_rewritten_for_the_same_worker_reached_another_way(tmp_path: Path) -> None:
    configured()
    worker = build.prepare().worker
    note = build.HOST_STUBS / ".built-from"
    written = note.stat().st_mtime_ns
    linked = tmp_path / "runtime"  # a copy's .runtime, a link to this one
    linked.symlink_to(build.CACHE)
    build.host_stubs(linked / worker.relative_to(build.CACHE))
    assert note.stat().st_mtime_ns == written and os.listdir(build.HOST_STUBS / "functionrpc")
