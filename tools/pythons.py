"""`make test-versions`: the suite on the other Python versions the template supports, each in a
virtual environment of its own (``.venv-3.12``, ``.venv-3.13``, from requirements-dev.txt): types
checked for that version, then the unit, infra, integration (Azurite) and runtime tests. The
runtime suite runs worker 4.34.0 on 3.12, and azure-functions-runtime behind a stand-in of the
host's proxy worker on 3.13 (tools/runtime/build.py). `make test` is the default version's.

An interpreter is ``pythonX.Y`` on PATH, else pyenv's newest X.Y; a missing one is said in one
line naming it (exit 2), after the versions that are there have run."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("3.12", "3.13")
TESTS = ("tests/unit", "tests/infra", "tests/integration", "tests/runtime")
# what `make typecheck` checks (recipes/, bench/ and client/ go with the example)
CHECKED = ["shared", "consumers", "function_app.py", "tools",
           *(d for d in ("recipes", "bench", "client") if (ROOT / d).is_dir())]  # fmt: skip


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


def environment(version: str, python: Path) -> Path:
    """.venv-X.Y with requirements-dev.txt, reinstalled when a requirements file changes."""
    venv = ROOT / f".venv-{version}"
    stamp = venv / ".installed"
    requirements = [ROOT / "requirements.txt", ROOT / "requirements-dev.txt"]
    if not stamp.exists() or any(r.stat().st_mtime > stamp.stat().st_mtime for r in requirements):
        subprocess.run([str(python), "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "-r", "requirements-dev.txt"], cwd=ROOT, check=True)
        stamp.touch()
    return venv / "bin" / "python"


def run(version: str, python: Path) -> bool:
    print(f"== Python {version} ({python})", flush=True)
    venv = environment(version, python)
    typed = subprocess.run([str(venv), "-m", "mypy", "--python-version", version, *CHECKED], cwd=ROOT, check=False)
    tests = subprocess.run([str(venv), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=ROOT, check=False)
    return typed.returncode == 0 and tests.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.pythons", description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(VERSIONS), help="X.Y (default: %(default)s)")
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
