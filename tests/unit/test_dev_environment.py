"""The conventions of Microsoft's azd templates, kept true: the dev container installs with the
project's own command, CI runs the README's test command, the deploy workflow signs in
without a secret, and VS Code's F5 attaches to the host the tasks start."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dev_container_installs_with_make_and_starts_azurite() -> None:
    container = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    deployed = re.search(r"param pythonVersion string = '([\d.]+)'", (ROOT / "infra" / "main.bicep").read_text())
    assert deployed and f"-{deployed[1]}-" in container["image"]  # the version a deployment runs by default
    assert container["postCreateCommand"].startswith("make install")
    assert "azurite" in container["postStartCommand"] and 10002 in container["forwardPorts"]
    features = " ".join(container["features"])
    assert all(tool in features for tool in ("node", "azd", "azure-functions-core-tools"))


def test_ci_runs_the_readme_test_command_with_the_real_worker() -> None:
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert re.search(r"^\s+- run: make worker$", workflow, re.MULTILINE)
    assert re.search(r"^\s+- run: make test$", workflow, re.MULTILINE)
    assert "make test" in (ROOT / ".ci" / "run").read_text() and "make test" in (ROOT / "README.md").read_text()
    assert 'python-version: ["3.11", "3.12", "3.13"]' in workflow  # make test on each supported version
    assert re.search(r"^make test-long$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert re.search(r"^\s+- run: make test-long$", workflow, re.MULTILINE)


def test_the_deploy_workflow_uses_federated_credentials_and_azd() -> None:
    workflow = (ROOT / ".github" / "workflows" / "azure-dev.yml").read_text()
    assert "id-token: write" in workflow and "--federated-credential-provider github" in workflow
    assert "azd provision --no-prompt" in workflow and "azd deploy --no-prompt" in workflow
    assert "secrets." not in workflow  # no client secret: OIDC


def test_f5_attaches_to_the_host_its_task_starts() -> None:
    launch = json.loads((ROOT / ".vscode" / "launch.json").read_text())["configurations"][0]
    tasks = {task["label"]: task for task in json.loads((ROOT / ".vscode" / "tasks.json").read_text())["tasks"]}
    assert launch["preLaunchTask"] in tasks and tasks[launch["preLaunchTask"]]["command"] == "host start"
    assert launch["connect"]["port"] == 9091  # the Functions extension's debugpy port


def test_none_of_it_is_deployed() -> None:
    ignored = (ROOT / ".funcignore").read_text().splitlines()
    assert {".devcontainer", ".vscode", ".git*"} <= set(ignored)


def test_resources_are_named_with_the_azd_abbreviations() -> None:
    main = (ROOT / "infra" / "main.bicep").read_text()
    abbreviations = json.loads((ROOT / "infra" / "abbreviations.json").read_text())
    names = re.findall(r"name: '([^']*)\$\{environmentName\}|name: '(st)\$\{", main)
    assert not [prefix for prefix in (a or b for a, b in names) if not prefix.startswith("${abbrs.")], names
    assert all(f"abbrs.{key}" in main for key in abbreviations)  # each one used


def test_the_readmes_one_test_commands_select_tests_in_their_lanes() -> None:
    """README "Two commands": ``make test ARGS=…`` selects tests make test runs (not marked long),
    and the pytest command given for a long one selects tests marked long."""
    import shlex
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    make_args = shlex.split(re.search(r'`make test ARGS="([^"]+)"`', text)[1])  # type: ignore[index]
    pytest_args = shlex.split(re.search(r"`\.venv/bin/python -m pytest ([^`]+)`", text)[1])  # type: ignore[index]

    lanes = [(args, lane, subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                                            "no:cacheprovider", "-m", lane, *args],
                                           cwd=ROOT, stdout=subprocess.PIPE, text=True))
             for args, lane in ((make_args, "not long"), (pytest_args, "long"))]  # fmt: skip
    for args, lane, process in lanes:  # collected side by side
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0 and "::" in output, (args, lane, output[-500:])
