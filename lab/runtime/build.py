"""Lay out the real Azure Functions Python worker as the Functions host ships it on Linux,
and this app as a remote build deploys it, so that tests can run the app where Azure runs it.

- Worker: the pinned release of github Azure/azure-functions-python-worker, every file checked
  against ``python-worker-<release>.sha256`` (beside this file), installed flat with the
  dependencies its own pyproject.toml pins into ``workers/python/3.11/LINUX/X64`` (the host's
  ``defaultWorkerPath``), with the gRPC stubs generated from its .proto files by its own grpcio-tools.
- App: the files that survive ``.funcignore``, plus ``.python_packages/lib/site-packages`` filled
  by ``pip install --target`` from requirements.txt, as ``func azure functionapp publish`` builds it.
- Interpreter: a bare virtual environment (no packages), like the image's system Python.

Where the release comes from: ``FUNCTIONS_PYTHON_WORKER`` (an archive or a folder), else the
archive that ``make worker`` downloaded into ``.runtime/downloads``. Built trees are cached
in ``.runtime/`` by content digest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import venv
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "4.34.0"
RELEASE_URL = f"https://github.com/Azure/azure-functions-python-worker/archive/refs/tags/{RELEASE}.tar.gz"
MANIFEST = Path(__file__).with_name(f"python-worker-{RELEASE}.sha256")
CACHE = ROOT / ".runtime"
DOWNLOADED = CACHE / "downloads" / f"azure-functions-python-worker-{RELEASE}.tar.gz"
SOURCE_SETTING = "FUNCTIONS_PYTHON_WORKER"
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
PACKAGES = Path(".python_packages", "lib", "site-packages")  # where the worker looks for the app's packages
# Python 3.13+: Azure runs the host's own proxy worker (not published) in front of azure-functions-runtime
# (PyPI), and worker 4.34 refuses 3.13. lab/runtime/proxy.py stands in for the proxy, with the packages
# the proxy bundles for 3.13 (its workers/pyproject.toml); the .proto files are the release's.
PROXY = sys.version_info >= (3, 13)
HOST_STUBS = CACHE / f"host-stubs-{PYTHON_VERSION}"  # the stubs' protobuf is this Python's
PROXY_PACKAGES = ["azure-functions-runtime==1.3.0", "azure-functions==1.24.0", "azurefunctions-extensions-base==1.1.0",
                  "grpcio~=1.70.0", "protobuf~=5.29.0"]  # fmt: skip
# The library tests' own consumers (tests/app.py), deployed as one more module of consumers/.
LIBRARY_TESTS = {"library_tests": ROOT / "tests" / "app.py"}


class WorkerNotConfigured(RuntimeError):
    """No worker release is available here (offline, and FUNCTIONS_PYTHON_WORKER unset)."""


@dataclass(frozen=True)
class Runtime:
    python: Path  # interpreter that runs the worker
    worker: Path  # .../workers/python/3.11/LINUX/X64, holding worker.py
    app: Path  # the deployed app folder (AzureWebJobsScriptRoot)


def configured() -> Path | None:
    """The worker release to use, or None when there is none (the suite then skips)."""
    named = os.environ.get(SOURCE_SETTING)
    if named:
        path = Path(named)
        if not path.exists():
            raise FileNotFoundError(f"{SOURCE_SETTING}={named} does not exist")
        return path
    return DOWNLOADED if DOWNLOADED.exists() else None


def prepare(
    switched_on: Sequence[str] = (), *, extra: Mapping[str, Path] | None = None, with_tests: bool = False
) -> Runtime:
    """The worker and the app; ``switched_on``: recipes' modules moved into consumers/ in the
    deployed copy, as ``make recipe`` moves them; ``extra``: more modules deployed into
    consumers/ (name -> source file); ``with_tests``: the library tests' consumers among them."""
    source = configured()
    if source is None:
        raise WorkerNotConfigured(
            f"the Azure Functions Python worker {RELEASE} is not available: run `make worker` (online) "
            f"or set {SOURCE_SETTING} to its release archive or folder"
        )
    files = verified_release(source)
    modules = {**(extra or {}), **(LIBRARY_TESTS if with_tests else {})}
    with _building():
        worker = proxy_dir(files) if PROXY else worker_dir(files)
        host_stubs(worker)
        return Runtime(python=bare_python(), worker=worker, app=app_dir(switched_on, modules))


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """One build at a time in .runtime/, whichever process asks (pytest-xdist's workers, a copy
    of the repository whose .runtime is this one): what is built is then only read."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- the worker --------------------------------------------------------------------------------


def expected_files() -> dict[str, str]:
    lines = (line.split(maxsplit=1) for line in MANIFEST.read_text().splitlines() if line.strip())
    return {name.strip(): digest for digest, name in lines}


def verified_release(source: Path) -> dict[str, bytes]:
    """The release's files by relative path, each checked against the pinned manifest.
    Archives from GitHub have a top folder (``azure-functions-python-worker-4.34.0/``)."""
    found = dict(_read(source))
    marker = "python/prodV4/worker.py"
    tops = {name[: -len(marker)] for name in found if name.endswith(marker)}
    if len(tops) != 1:
        raise ValueError(f"{source} does not hold one Python worker release ({marker} found {len(tops)} times)")
    top = tops.pop()
    files: dict[str, bytes] = {}
    for name, digest in expected_files().items():
        content = found.get(top + name)
        if content is None:
            raise ValueError(f"{source}: {name} is missing from the worker release")
        if hashlib.sha256(content).hexdigest() != digest:
            raise ValueError(f"{source}: {name} does not match release {RELEASE} (checksum differs)")
        files[name] = content
    return files


def _read(source: Path) -> Iterator[tuple[str, bytes]]:
    if source.is_dir():
        for path in source.rglob("*"):
            if path.is_file():
                yield path.relative_to(source).as_posix(), path.read_bytes()
    elif zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield info.filename, archive.read(info)
    else:
        with tarfile.open(source) as archive:
            for member in archive.getmembers():
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    yield member.name.removeprefix("./"), extracted.read()


def worker_dir(files: dict[str, bytes]) -> Path:
    """``workers/python/<version>/LINUX/X64`` as the host lays it out: worker.py beside the
    azure_functions_worker package and its dependencies, worker.config.json one level up."""
    digest = hashlib.sha256(MANIFEST.read_bytes() + PYTHON_VERSION.encode()).hexdigest()[:16]
    workers = CACHE / f"worker-{digest}" / "workers" / "python"
    target = workers / PYTHON_VERSION / "LINUX" / "X64"
    if (target / ".complete").exists():
        return target
    shutil.rmtree(workers.parent, ignore_errors=True)
    for name, content in files.items():
        if name.startswith("azure_functions_worker/"):
            _write(target / name, content)
    _write(target / "worker.py", files["python/prodV4/worker.py"])
    _write(workers / "worker.config.json", files["python/prodV4/worker.config.json"])
    _pip_install(target, _dependencies(files["pyproject.toml"]))
    _generate_stubs(target / "azure_functions_worker" / "protos", target, ["setuptools<81"])
    (target / ".complete").touch()
    return target


def proxy_dir(files: dict[str, bytes]) -> Path:
    """The same folder for Python 3.13+: lab/runtime/proxy.py as worker.py, the proxy's packages,
    and the release's protos as ``proxy_worker.protos`` (the module the proxy hands the runtime)."""
    proxy = Path(__file__).with_name("proxy.py").read_bytes()
    digest = hashlib.sha256(MANIFEST.read_bytes() + proxy + f"{PROXY_PACKAGES}{PYTHON_VERSION}".encode()).hexdigest()
    target = CACHE / f"proxy-{digest[:16]}" / "workers" / "python" / PYTHON_VERSION / "LINUX" / "X64"
    if (target / ".complete").exists():
        return target
    shutil.rmtree(target.parents[4], ignore_errors=True)
    for name, content in files.items():
        if name.startswith("azure_functions_worker/protos/"):
            _write(target / "proxy_worker" / name.removeprefix("azure_functions_worker/"), content)
    _write(target / "proxy_worker" / "__init__.py", b"")
    _write(target / "worker.py", proxy)
    _pip_install(target, PROXY_PACKAGES)
    _generate_stubs(target / "proxy_worker" / "protos", target, ["grpcio-tools~=1.70.0"])
    (target / ".complete").touch()
    return target


def _dependencies(pyproject: bytes) -> list[str]:
    """The worker's own pins (grpcio, protobuf, grpcio-tools, azure-functions, ...) for this Python."""
    declared = tomllib.load(io.BytesIO(pyproject))["project"]["dependencies"]
    requirements = [Requirement(line) for line in declared]
    return [f"{r.name}{r.specifier}" for r in requirements if r.marker is None or r.marker.evaluate()]


def _generate_stubs(protos: Path, target: Path, tools: list[str]) -> None:
    """protoc with the grpcio-tools of the worker's pins (``target``) or ``tools``; the imports
    made package-relative so the stubs live in the ``protos`` package the worker imports."""
    sources = protos / "_src" / "src" / "proto"
    names = [p.relative_to(sources).as_posix() for p in sorted(sources.rglob("*.proto"))]
    build_tools = target.parents[4] / "build-tools"  # grpcio-tools 1.59 imports pkg_resources
    _pip_install(build_tools, tools)
    _run([str(bare_python()), "-m", "grpc_tools.protoc", f"-I{sources}", f"--python_out={protos}",
          f"--grpc_python_out={protos}", *names], env={"PYTHONPATH": f"{target}:{build_tools}"})  # fmt: skip
    for stub in protos.rglob("*_pb2*.py"):
        up = "." * len(stub.relative_to(protos).parts)  # protoc imports from the proto root
        code = stub.read_text()
        code = re.sub(r"^import (\w+_pb2)", rf"from {up} import \1", code, flags=re.MULTILINE)
        code = re.sub(r"^from (\w+) import (\w+_pb2)", rf"from {up}\1 import \2", code, flags=re.MULTILINE)
        stub.write_text(code)


def host_stubs(worker: Path) -> Path:
    """The same generated stubs for the test's side of the stream, as package ``functionrpc``
    under .runtime/host-stubs (lab/runtime/host.py imports them): written again only for another
    worker build (named by its content, wherever the .runtime it is in is linked from), the note
    of which is written last, so that a copy cut short is written again."""
    protos = worker / ("proxy_worker" if PROXY else "azure_functions_worker") / "protos"
    package = HOST_STUBS / "functionrpc"
    built_from, build = HOST_STUBS / ".built-from", worker.parents[4].name  # worker-<digest>, proxy-<digest>
    if built_from.exists() and built_from.read_text() == build:
        return package
    built_from.unlink(missing_ok=True)
    shutil.rmtree(package, ignore_errors=True)
    for stub in protos.rglob("*_pb2*.py"):
        _write(package / stub.relative_to(protos), stub.read_bytes())
    for folder in (package, package / "identity", package / "shared"):
        _write(folder / "__init__.py", b"")
    built_from.write_text(build)
    return package


# -- the app -----------------------------------------------------------------------------------


def app_dir(switched_on: Sequence[str] = (), extra: Mapping[str, Path] | None = None) -> Path:
    """The app as deployed: files that survive .funcignore, packages in .python_packages
    (reinstalled only when requirements.txt changes); with recipes ``switched_on`` or ``extra``
    modules (name -> source). A folder per content, written once and never rewritten: a worker
    another process runs from it keeps its files."""
    files = {name: (ROOT / name).read_bytes() for name in deployed_files()}
    # recipes/ is not deployed (.funcignore): a recipe on is in consumers/ (deployed above); one
    # still off is read from recipes/ when asked for (an app without the example has none)
    off = [module for module in switched_on if f"consumers/{module}.py" not in files]
    for module in extra or {}:
        if f"consumers/{module}.py" in files:
            raise ValueError(f"consumers/{module}.py exists already: name the extra module otherwise")
    modules = {**{module: ROOT / "recipes" / f"{module}.py" for module in off}, **(extra or {})}
    files.update({f"consumers/{module}.py": source.read_bytes() for module, source in modules.items()})
    packages = _packages()
    digest = hashlib.sha256(str(packages).encode())  # the packages it links: its Python's, its requirements'
    for name in sorted(files):
        digest.update(f"\0{name}\0{len(files[name])}\0".encode() + files[name])
    app = CACHE / f"app-{PYTHON_VERSION}-{digest.hexdigest()[:16]}"
    complete = app / ".complete"
    if not complete.exists():
        shutil.rmtree(app, ignore_errors=True)  # a build cut short
        for name, content in files.items():
            _write(app / name, content)
        (app / PACKAGES.parts[0]).symlink_to(packages, target_is_directory=True)
        complete.touch()
        _forget_old_apps()
    os.utime(complete)  # in use: kept by _forget_old_apps
    return app


def _packages() -> Path:
    """requirements.txt installed as .python_packages, once per content and Python version
    (an app folder links the packages of its own requirements: none is ever reinstalled)."""
    requirements = (ROOT / "requirements.txt").read_bytes()
    root = CACHE / f"packages-{PYTHON_VERSION}-{hashlib.sha256(requirements).hexdigest()[:16]}"
    complete = root / ".complete"
    if not complete.exists():
        shutil.rmtree(root, ignore_errors=True)  # an install cut short
        _pip_install(root / PACKAGES, ["-r", str(ROOT / "requirements.txt")])
        complete.touch()
    return (root / PACKAGES.parts[0]).resolve()


def _forget_old_apps(unused_for: float = 86_400) -> None:
    """Apps no build has asked for in a day (each edit of the app makes a new one), packages
    no app left links, workers' logs as old."""

    def old(path: Path) -> bool:
        return time.time() - path.stat().st_mtime > unused_for

    for complete in CACHE.glob("app-*/.complete"):
        if old(complete):
            shutil.rmtree(complete.parent, ignore_errors=True)
    linked = {app.resolve().parent for app in CACHE.glob(f"app-*/{PACKAGES.parts[0]}")}
    for packages in CACHE.glob("packages-*"):
        if packages.resolve() not in linked and old(packages):
            shutil.rmtree(packages, ignore_errors=True)
    for log in CACHE.glob("worker-*.log"):
        if old(log):
            log.unlink(missing_ok=True)


def deployed_files() -> list[str]:
    """Paths that `func azure functionapp publish` uploads: all but .funcignore's matches
    (gitignore syntax)."""
    ignore = pathspec.GitIgnoreSpec.from_lines((ROOT / ".funcignore").read_text().splitlines())
    kept = []
    for folder, dirs, files in os.walk(ROOT):
        relative = Path(folder).relative_to(ROOT)
        dirs[:] = sorted(d for d in dirs if not ignore.match_file(f"{(relative / d).as_posix()}/"))
        kept += [(relative / f).as_posix() for f in sorted(files) if not ignore.match_file((relative / f).as_posix())]
    return kept


# -- helpers -----------------------------------------------------------------------------------


def bare_python() -> Path:
    """A virtual environment with nothing installed: the worker must bring its own packages
    and the app its own, as on Azure, where the image's Python has neither."""
    home = CACHE / f"python{PYTHON_VERSION}"
    python = home / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False, clear=True).create(home)
    return python


def _pip_install(target: Path, requirements: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
          "--target", str(target), *requirements])  # fmt: skip


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def download() -> Path:
    """`make worker`: fetch the pinned release archive (online) and verify every file."""
    import requests

    DOWNLOADED.parent.mkdir(parents=True, exist_ok=True)
    response = requests.get(RELEASE_URL, timeout=120)
    response.raise_for_status()
    partial = DOWNLOADED.with_suffix(".partial")
    partial.write_bytes(response.content)
    verified_release(partial)
    partial.replace(DOWNLOADED)
    return DOWNLOADED


def main(argv: list[str] | None = None) -> int:
    """``make worker``: download the pinned release (network) and build; ``--help`` only says so."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m lab.runtime.build",
        description=f"Download the Azure Functions Python worker {RELEASE} (needs the network) and lay it out "
        f"with this app in .runtime/ for the real-worker tests. Offline: set {SOURCE_SETTING} to the release "
        "archive instead (.ci/run does).",
    ).parse_args(argv)
    import requests

    try:
        if os.environ.get(SOURCE_SETTING):  # offline, as .ci/run: the release is here already; checked
            release = Path(os.environ[SOURCE_SETTING])
            verified_release(release)
            print(f"{SOURCE_SETTING} gives the worker release {RELEASE}, checked: {release} (nothing to download)")
        else:
            print(download())
    except requests.HTTPError as exc:
        print(f"make worker: GitHub answered {exc} for {RELEASE_URL}"[:300], file=sys.stderr)
        return 2
    except requests.RequestException as exc:
        print(f"make worker: {type(exc).__name__} reaching GitHub; offline, set {SOURCE_SETTING} to the worker "
              f"{RELEASE} release archive or folder", file=sys.stderr)  # fmt: skip
        return 2
    except (OSError, ValueError, tarfile.TarError) as exc:  # a missing path, not the release
        print(f"make worker: {SOURCE_SETTING} is not the worker {RELEASE} release: {exc}"[:300].replace("\n", " "),
              file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
