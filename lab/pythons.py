"""`make test-versions`: `make test` on the other Python versions the template supports (3.11,
3.12, 3.13 but the one running), each in a virtual environment of its own (``.venv-3.12``, from
tests/requirements.txt, as `make install` builds it). The runtime suite runs worker 4.34.0 up to
3.12, and azure-functions-runtime behind a stand-in of the host's proxy worker on 3.13
(lab/runtime/build.py).

An interpreter is ``pythonX.Y`` on PATH, else pyenv's newest X.Y; a missing one is said in one
line naming it (exit 2), after the versions that are there have run."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lab.infra_checks import PYTHON_VERSIONS

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ("3.11", *PYTHON_VERSIONS)  # 3.11 for local use; Azure gets those infra/ allows


def interpreter(version: str) -> Path | None:
    """``pythonX.Y`` on PATH (pyenv's shims excluded: they answer for one version only), else
    the newest X.Y.* pyenv has installed."""
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found:
        return Path(found)
    if shutil.which("pyenv") is None:
        return None
    listed = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False).stdout
    patches = [v for v in listed.split() if v.startswith(f"{version}.") and v.removeprefix(f"{version}.").isdigit()]
    if not patches:
        return None
    newest = max(patches, key=lambda v: int(v.rsplit(".", 1)[1]))
    prefix = subprocess.run(["pyenv", "prefix", newest], capture_output=True, text=True, check=False).stdout.strip()
    python = Path(prefix, "bin", "python3")
    return python if python.exists() else None


def run(version: str, python: Path) -> bool:
    """make test with .venv-X.Y (make installs it from the requirements)."""
    print(f"== Python {version} ({python})", flush=True)
    done = subprocess.run(["make", "--no-print-directory", f"VENV=.venv-{version}", f"PYTHON={python}", "test",
                           "ARGS=-p no:cacheprovider"], cwd=ROOT, check=False)  # fmt: skip
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.pythons", description=__doc__.split("\n\n")[0])
    others = [v for v in SUPPORTED if v != f"{sys.version_info.major}.{sys.version_info.minor}"]
    parser.add_argument(
        "versions", nargs="*", default=others, help="X.Y (default: the supported but this one, %(default)s)"
    )
    versions = parser.parse_args(argv).versions
    found = {version: interpreter(version) for version in versions}
    failed = [version for version, python in found.items() if python is not None and not run(version, python)]
    missing = [version for version, python in found.items() if python is None]
    for version in missing:
        print(f"Python {version} not found (no python{version} on PATH, none in pyenv): its suite did not run",
              file=sys.stderr)  # fmt: skip
    if failed:
        print(f"failed on Python {', '.join(failed)}", file=sys.stderr)
        return 1
    return 2 if missing else 0


if __name__ == "__main__":
    os.environ.pop("VIRTUAL_ENV", None)  # each version's own environment, not the caller's
    sys.exit(main())
