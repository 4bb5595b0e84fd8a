"""Every command answers --help without starting a run, and one without its settings says
so in one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def describes_itself(module: str) -> None:
    """``python -m module --help`` answers and starts no emulator."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0 and len(done.stdout) > 80, done.stderr[-500:]
    assert "Azurite" not in done.stderr  # no emulator was started


@pytest.mark.parametrize("module", ["lab.purge_cost", "lab.delivery_checks", "shared.idempotency.resubmit",
                                    "lab.runtime.build", "lab.infra_checks", "shared.idempotency.replay",
                                    "lab.workbook_picture", "lab.pythons", "lab.adopters", "lab.lanes",
                                    "shared.idempotency.audit", "shared.idempotency.resend"])  # fmt: skip
def test_help_describes_the_command_and_starts_nothing(module: str) -> None:
    describes_itself(module)


@pytest.mark.parametrize("module", ["lab.delivery_checks retention", "lab.delivery_checks leases",
                                    "lab.infra_checks policies"])  # fmt: skip
def test_a_check_given_a_folder_without_infra_says_so_in_one_line(module: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", *module.split(), str(tmp_path / "nowhere")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no main.bicep" in done.stderr, done.stderr


def test_a_telemetry_failure_does_not_keep_the_functions_from_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHON_ENABLE_OPENTELEMETRY on, but the distro cannot start (no connection string):
    the app still imports and indexes its functions, and says why telemetry is off."""
    from opentelemetry import trace

    import function_app

    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)  # as on a fresh worker
    monkeypatch.setenv("PYTHON_ENABLE_OPENTELEMETRY", "true")
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    logged: list[str] = []
    monkeypatch.setattr(logging.getLogger("idempotency"), "exception", lambda message, *a: logged.append(message))
    function_app.ensure_telemetry()
    assert logged and "could not be configured" in logged[0]


def test_a_python_version_not_on_the_machine_is_named_in_one_line() -> None:
    """make test-versions on a machine without one of the interpreters: one line naming it
    (exit 2), no stack trace, and nothing else was run for it."""
    done = subprocess.run([sys.executable, "-m", "lab.pythons", "2.1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and "Python 2.1 not found" in done.stderr, done.stderr


def test_make_worker_without_the_network_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    """`make worker`'s program offline (a proxy that refuses: no request leaves): one line naming
    FUNCTIONS_PYTHON_WORKER, exit 2; that setting naming no release (missing, not an archive of
    it): one line, exit 2; the real release: checked, nothing to download (.ci/run sets it)."""
    offline = {k: v for k, v in os.environ.items() if k not in ("FUNCTIONS_PYTHON_WORKER", "NO_PROXY", "no_proxy")}
    offline |= {"HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    empty = tmp_path / "worker.tar.gz"
    empty.write_bytes(b"")
    cases = [(offline, 2), ({**offline, "FUNCTIONS_PYTHON_WORKER": str(tmp_path / "none")}, 2),
             ({**offline, "FUNCTIONS_PYTHON_WORKER": str(empty)}, 2)]  # fmt: skip
    if os.environ.get("FUNCTIONS_PYTHON_WORKER"):
        cases.append(({**offline, "FUNCTIONS_PYTHON_WORKER": os.environ["FUNCTIONS_PYTHON_WORKER"]}, 0))
    for env, code in cases:
        done = subprocess.run([sys.executable, "-m", "lab.runtime.build"], cwd=ROOT, capture_output=True, text=True,
                              env=env, timeout=120)  # fmt: skip
        assert done.returncode == code, done.stderr[-2000:]
        said = done.stderr if code else done.stdout
        assert said.count("\n") == 1 and "FUNCTIONS_PYTHON_WORKER" in said, said
