"""`make remove-example` deletes the Makefile's EXAMPLE paths: nothing that stays may import
them (the library, its tests, the tools they use, the app's other consumers), or the app and
`make test` would break without the example — but a module of consumers/ that make refuses to
remove the example for (a recipe switched on, which uses the example's domain)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def example_paths() -> list[str]:
    makefile = ROOT.joinpath("Makefile").read_text().replace("\\\n", " ")
    found = re.search(r"^EXAMPLE := (.+)$", makefile, re.MULTILINE)
    assert found, "the Makefile has no EXAMPLE list"
    return found.group(1).split()


def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def imported(source: Path) -> set[str]:
    """Every module an import statement names, with ``from a import b`` as a and a.b."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def refused_for(makefile: str) -> re.Pattern[str]:
    """The Makefile's USING_EXAMPLE pattern: a consumers/ module it matches stops remove-example."""
    found = re.search(r"grep -lE '([^']+)'", makefile)
    assert found, "the Makefile's remove-example no longer refuses while consumers/ uses the example"
    return re.compile(found.group(1).replace("[.]", r"\."))


def test_nothing_that_stays_imports_the_example() -> None:
    example = example_paths()
    refused = refused_for(ROOT.joinpath("Makefile").read_text())
    modules = {module_of(p) for p in example if p.endswith(".py") or "." not in p}
    assert {"consumers.orders", "consumers.order_events", "recipes", "lab.bench", "lab.demo"} <= modules
    tree = [p.relative_to(ROOT) for p in ROOT.rglob("*.py")]
    staying = [ROOT / p for p in tree if not p.parts[0].startswith(".") and "node_modules" not in p.parts
               and not any(p.as_posix().startswith(e) for e in example)
               and not (p.parts[0] == "consumers" and refused.search((ROOT / p).read_text()))]  # fmt: skip
    assert ROOT / "tests" / "app.py" in staying
    uses = {(p.relative_to(ROOT).as_posix(), name) for p in staying for name in imported(p)
            if any(name == m or name.startswith(m + ".") for m in modules)}  # fmt: skip
    assert uses == set(), "these stay after make remove-example but import the example"
