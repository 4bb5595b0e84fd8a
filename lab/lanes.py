"""`python -m lab.lanes`: how long each test lane takes in a fresh clone of this repository, and
how many tests it runs; writes lab/results/lanes.{json,md} (the README's figures).

In a clone of what is committed, installed first (not timed: ``make install``, checkov's
environment, the worker's build when FUNCTIONS_PYTHON_WORKER is set): ``make test`` ``--runs``
times in a row, the last one beside another ``make test`` in a second clone (``--beside``), then
``make test-long`` once. Each run's time, exit code and pytest's closing lines; a lane's tests are
those lines' counts added up. Set FUNCTIONS_PYTHON_WORKER as .ci/run does, else the real-worker
tests skip (the record says which).

    python -m lab.lanes [--runs 3] [--no-beside] [--no-long] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "lab" / "results"  # beside the lab, not the example's bench (make remove-example)
COUNTED = re.compile(r"(\d+) (passed|skipped|failed|errors?)\b")


@dataclass
class Run:
    command: str
    seconds: float
    exit_code: int
    beside: bool = False
    tests: dict[str, int] = field(default_factory=dict)
    summaries: list[str] = field(default_factory=list)


def clone(where: Path) -> Path:
    """A fresh clone of the committed tree, installed as a user installs it (the worker's build
    too, when FUNCTIONS_PYTHON_WORKER says where its release is)."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(where)], check=True)
    worker = ["worker"] if os.environ.get("FUNCTIONS_PYTHON_WORKER") else []
    targets = ["install", ".venv-checkov/.installed", *worker]
    subprocess.run(["make", "--no-print-directory", *targets], cwd=where, check=True, stdout=subprocess.DEVNULL)
    return where


def timed(tree: Path, target: str, logs: Path, beside: Path | None = None) -> list[Run]:
    """``make target`` in ``tree``; with ``beside``, another ``make test`` there at the same time.
    Each one's output goes to a file in ``logs``; each one's time is until it ends."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MAKE", "MFLAGS", "VIRTUAL_ENV"))}
    jobs = [(tree, target)] + ([(beside, "test")] if beside else [])
    began, running = time.monotonic(), {}
    for where, goal in jobs:
        log = logs / f"{time.strftime('%H%M%S')}-{where.name}-{goal}.log"
        with log.open("w") as out:
            process = subprocess.Popen(["make", "--no-print-directory", goal], cwd=where, env=env,
                                       stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        running[process] = (goal, log)
    ended: dict[subprocess.Popen[bytes], float] = {}
    while len(ended) < len(running):
        for process in running:
            if process not in ended and process.poll() is not None:
                ended[process] = time.monotonic()
        time.sleep(1)  # polling processes that run for minutes
    runs = [result(goal, log.read_text(), process.returncode, round(ended[process] - began), beside is not None)
            for process, (goal, log) in running.items()]  # fmt: skip
    for run in runs:
        print(f"{run.command}{' (beside another)' if run.beside else ''}: {run.seconds} s, exit {run.exit_code}, "
              f"{run.tests}", flush=True)  # fmt: skip
    return runs


def result(target: str, output: str, exit_code: int, seconds: int, beside: bool) -> Run:
    """A run, from its output: pytest's closing lines and their counts added up."""
    summaries = [line.strip("= ") for line in output.splitlines()
                 if COUNTED.search(line) and re.search(r" in [\d.]+s", line)]  # fmt: skip
    tests: Counter[str] = Counter()
    for line in summaries:
        for count, kind in COUNTED.findall(line):
            tests[kind.rstrip("s") if kind.startswith("error") else kind] += int(count)
    if exit_code:
        print(output[-3000:], file=sys.stderr)
    return Run(f"make {target}", seconds, exit_code, beside, dict(tests), summaries)


def write(about: dict[str, object], runs: list[Run]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lanes.json").write_text(json.dumps({**about, "runs": [asdict(run) for run in runs]}, indent=2) + "\n")
    rows = [f"| {run.command}{' (beside another make test)' if run.beside else ''} | {run.seconds} | "
            f"{run.exit_code} | {run.tests.get('passed', 0)} | {run.tests.get('skipped', 0)} |"
            for run in runs]  # fmt: skip
    (RESULTS / "lanes.md").write_text(
        f"Run: commit {about['commit']}, {about['date']}, Python {about['python']}, {about['cores']} cores; "
        f"a fresh clone, installs not timed; FUNCTIONS_PYTHON_WORKER {'set' if about['worker'] else 'unset'}.\n\n"
        "`make test` is the adopter's loop; `make test-long` what CI adds (the tests marked long, `make test`\n"
        "on the other Pythons, the adopters' paths). Written by `python -m lab.lanes`.\n\n"
        "| command | seconds | exit | tests passed | skipped |\n|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.lanes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="make test runs in a row (default: %(default)s)")
    parser.add_argument("--no-beside", dest="beside", action="store_false", help="the last run alone too")
    parser.add_argument("--no-long", dest="long", action="store_false", help="leave make test-long out")
    parser.add_argument("--logs", type=Path, help="keep each run's output in this folder")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lanes-") as base:
        logs = args.logs or Path(base, "logs")
        logs.mkdir(parents=True, exist_ok=True)
        tree = clone(Path(base, "a"))
        other = clone(Path(base, "b")) if args.beside else None
        runs = [run for n in range(args.runs)
                for run in timed(tree, "test", logs, other if n == args.runs - 1 else None)]  # fmt: skip
        if args.long:
            runs += timed(tree, "test-long", logs)
    write({"commit": commit, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "python": ".".join(map(str, sys.version_info[:3])), "cores": os.cpu_count(),
           "worker": bool(os.environ.get("FUNCTIONS_PYTHON_WORKER"))}, runs)  # fmt: skip
    return 1 if any(run.exit_code for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
