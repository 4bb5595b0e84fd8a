"""The library's layout as the README describes it: small faces over private modules, no
import circle (at run time or for the type checker), azure.functions only in the Functions
face, and no Azure SDK under a store author's contract."""

from __future__ import annotations

import ast
import importlib
import re
import types
from collections.abc import Callable
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[2] / "shared" / "idempotency"


def _name(path: Path) -> str:
    parts = path.relative_to(LIBRARY.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in LIBRARY.rglob("*.py")}


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, type-only imports included, resolved to the
    library's modules (``from . import x`` of a submodule, ``from .pkg import name``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return found


def _edges(module: str) -> set[str]:
    """Library modules imported, with the packages their import runs first (a module outside
    ``shared.idempotency.stores`` that imports ``stores._base`` runs ``stores/__init__`` too)."""
    edges = set()
    for target in _imports(module) & MODULES.keys():
        edges.add(target)
        parent = target.rpartition(".")[0]
        while parent != "shared.idempotency" and not module.startswith(parent + ".") and module != parent:
            edges.add(parent)
            parent = parent.rpartition(".")[0]
    edges.discard(module)
    return edges


def _cycle(edges: Callable[[str], set[str]] = _edges) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(edges(module)):
            if target == "shared.idempotency":
                continue  # the root face imports everything and nothing imports it
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(MODULES):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_module_of_the_library_imports_itself_back() -> None:
    assert _cycle() is None


def test_the_cycle_check_sees_a_circle() -> None:
    """The check above can fail: telemetry importing the consumer back (as it once did, for
    types) closes a circle."""

    def with_telemetry_importing_the_consumer(module: str) -> set[str]:
        return _edges(module) | ({"shared.idempotency.consumer"} if module.endswith(".telemetry") else set())

    found = _cycle(with_telemetry_importing_the_consumer)
    assert found is not None and {"shared.idempotency.consumer", "shared.idempotency.telemetry"} <= set(found)


def test_only_the_functions_face_imports_azure_functions() -> None:
    importers = {m for m in MODULES if any(i.startswith("azure.functions") for i in _imports(m))}
    assert importers and all(m.startswith("shared.idempotency.functions") for m in importers)


@pytest.mark.parametrize("module", ["stores._base", "stores._records", "stores._memory", "config", "messages", "keys"])
def test_a_store_author_meets_no_azure_sdk(module: str) -> None:
    """The contract, its records and the memory store import no Azure SDK: a store of
    another kind needs none (the Azure plumbing is in stores/_azure.py)."""
    assert not [i for i in _imports(f"shared.idempotency.{module}") if i.startswith("azure")]


def test_the_library_never_imports_the_app() -> None:
    app = ("function_app", "consumers", "recipes")
    assert not {(m, i) for m in MODULES for i in _imports(m) if i.startswith(app)}


FACES = ["shared.idempotency", "shared.idempotency.stores", "shared.idempotency.functions",
         "shared.idempotency.functions.adapters", "shared.idempotency.functions.registry",
         "shared.idempotency.testing"]  # fmt: skip


@pytest.mark.parametrize("face", FACES)
def test_each_face_docstring_names_every_public_name_once(face: str) -> None:
    """Where does X live: its face's docstring says, once, for every name the face exports."""
    module = importlib.import_module(face)
    named = {name: len(re.findall(rf"``{re.escape(name)}``", module.__doc__ or "")) for name in module.__all__}
    assert {name: times for name, times in named.items() if times != 1} == {}


def test_every_public_module_of_the_library_is_a_face_checked_above() -> None:
    """A new public module with an ``__all__`` joins FACES, so its docstring is checked too."""
    public = [m for m in MODULES if not any(part.startswith("_") for part in m.split("."))]
    assert {m for m in public if hasattr(importlib.import_module(m), "__all__")} == set(FACES)


@pytest.mark.parametrize(("face", "most"), [("shared.idempotency", 21), ("shared.idempotency.functions", 9)])
def test_the_faces_a_user_meets_first_stay_small(face: str, most: int) -> None:
    """The root is what a handler author writes; the Functions face one call per trigger
    (``on_*``, as many as there are sources) plus the consumer wiring. Building blocks live in
    their modules and submodules."""
    names = importlib.import_module(face).__all__
    assert len([name for name in names if not name.startswith("on_")]) <= most


def test_a_face_exports_only_what_it_lists() -> None:
    """A name that left a face is gone from it, not still importable through a leftover import."""
    for face in ("shared.idempotency", "shared.idempotency.functions"):
        module = importlib.import_module(face)
        held = {name for name, value in vars(module).items() if not name.startswith("_")
                and not isinstance(value, types.ModuleType)}  # fmt: skip
        assert held == set(module.__all__), face


def test_every_table_write_builds_its_transaction_in_one_place() -> None:
    """Issue 58: the SDK's transaction call appears only in the SDK transport's own module; every
    other write goes through the store's transport (``Transactions``: lean by default)."""
    calls = {
        str(path.relative_to(LIBRARY.parent.parent))
        for path in [*LIBRARY.rglob("*.py"), *(LIBRARY.parents[1] / "lab").rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "submit_transaction"
    }
    assert calls == {"shared/idempotency/stores/_table_sdk.py"}
