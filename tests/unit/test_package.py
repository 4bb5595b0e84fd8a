"""`pip install .` yields the library — shared.idempotency and its dependencies, extras per
store — without the example app around it."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_library_and_imports_without_the_example(tmp_path: Path) -> None:
    source = tmp_path / "source"  # setuptools builds in the source tree: keep the checkout clean
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "node_modules", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(tmp_path)],
                   check=True, cwd=tmp_path)  # fmt: skip
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    code = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert "shared/idempotency/consumer.py" in code and "shared/idempotency/testing/_contract.py" in code
    assert not [n for n in code if not n.startswith("shared/idempotency/")]  # no shared/__init__.py: a namespace
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("jsonschema") for r in requires)
    assert any(r.startswith("azure-data-tables") and 'extra == "table"' in r for r in requires)
    assert any(r.startswith("azure-cosmos") and 'extra == "cosmos"' in r for r in requires)
    assert metadata["License-File"] == "LICENSE" or "LICENSE" in str(metadata.get_all("License-File"))

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True)  # fmt: skip
    # An app of its own with a shared/ folder (no __init__.py, as this template keeps it): both merge.
    app = tmp_path / "app"
    (app / "shared" / "domain").mkdir(parents=True)
    (app / "shared" / "domain" / "__init__.py").write_text("NAME = 'domain'\n")
    probe = (
        "import shared.idempotency as lib, shared.domain as d, importlib.util as u;"
        "from shared.idempotency.stores import MemoryStore;"
        "print(lib.__file__, d.NAME, u.find_spec('consumers'), u.find_spec('function_app'))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])}
    found = subprocess.run([sys.executable, "-c", probe], cwd=app, env=env, capture_output=True, text=True,
                           check=True).stdout.split()  # fmt: skip
    assert found == [str(site / "shared" / "idempotency" / "__init__.py"), "domain", "None", "None"]
