"""The docs' code runs: every Python block of the pages a user reads parses and its imports
resolve, every block marked ``run`` runs, every `python -m …` and `make …` they name exists,
every dotted name of the project they cite resolves, and every name they say comes from a
module is importable from it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The same pages collected with or without the example (make remove-example deletes recipes/): a page
# that is gone is skipped, so that an adopter's copy collects the library's tests as the template does.
READ = [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    "recipes/README.md",
    "infra/README.md",
]
PAGES = [pytest.param(p, marks=pytest.mark.skipif(not (ROOT / p).is_file(), reason=f"{p} was removed")) for p in READ]
FENCE = re.compile(r"^( *)```(\w*) ?(\S*)\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
PROJECT = r"(?:shared|lab|tests|consumers|recipes)"
COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\S*python3?|make)\b(?: -m ([\w.]+)|(?= )((?: [a-z][\w-]*(?=\s|$|`))+))")
DOTTED = re.compile(rf"`({PROJECT}(?:\.\w+)+)(?:\(\))?`")
FILES = (".json", ".py", ".md", ".bicep", ".yaml", ".txt", ".toml", ".example")  # `recipes.json`: a file
# "`a()`, `b` and `c`, for tests, from `module`": the names a clause says a module gives.
CLAIM = re.compile(rf"(?:from|in) `({PROJECT}(?:\.\w+)*)`|\(`({PROJECT}(?:\.\w+)*)`\)")
NAME = re.compile(r"`(\w+)(?:\([^`]*\))?`")


def blocks(page: str) -> list[tuple[str, str, str]]:
    """(language, file, text) of every fenced block of the page, dedented."""
    found = []
    for indent, language, path, text in FENCE.findall((ROOT / page).read_text()):
        found.append((language, path, "".join(line[len(indent) :] + "\n" for line in text.splitlines())))
    return found


def code(page: str) -> list[str]:
    """The page's code a user types: its inline code spans and its non-Python blocks."""
    text = (ROOT / page).read_text()
    return [*re.findall(r"`([^`\n]+)`", FENCE.sub("", text)), *(t for lang, _, t in blocks(page) if lang != "python")]


def written(page: str) -> set[str]:
    """The modules the page's own blocks create (``consumers/invoices.py``: ``consumers.invoices``)."""
    return {path.removesuffix(".py").replace("/", ".") for _, path, _ in blocks(page) if path.endswith(".py")}


def _spec(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def _module(module: str) -> str | None:
    """``module``, or the recipe's module where the docs name it switched on (``consumers.returns``:
    ``recipes.returns``); None when neither exists."""
    return next((m for m in (module, re.sub(r"^consumers\.", "recipes.", module)) if _spec(m)), None)


def removed_with_the_example(module: str) -> bool:
    """``module`` is the example's, and make remove-example deleted it (Makefile's EXAMPLE):
    the docs still describe the example, which an adopter may have removed."""
    listed = re.search(r"^EXAMPLE := (.*?)(?<!\\)$", (ROOT / "Makefile").read_text(), re.MULTILINE | re.DOTALL)
    assert listed, "the Makefile lists no EXAMPLE"
    parts = module.split(".")
    paths = {"/".join(parts[:n]) + end for n in range(1, len(parts) + 1) for end in ("", ".py")}
    return any(entry in paths and not (ROOT / entry).exists() for entry in listed.group(1).replace("\\", " ").split())


def resolves(module: str, name: str | None = None) -> bool:
    """``module`` exists, and gives ``name`` (an attribute or a submodule) when one is asked for."""
    found = _module(module)
    if found is None and removed_with_the_example(module):
        return True
    if found is None or name is None:
        return found is not None
    return hasattr(importlib.import_module(found), name) or _spec(f"{found}.{name}")


def dotted(path: str) -> bool:
    """A module, or a module's attribute chain (``shared.idempotency.functions.on_servicebus``)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        if (found := _module(".".join(parts[:cut]))) is not None:
            value: object = importlib.import_module(found)
            for attribute in parts[cut:]:
                if not hasattr(value, attribute):
                    return removed_with_the_example(path)
                value = getattr(value, attribute)
            return True
    return removed_with_the_example(path)


def targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_parses_and_imports_what_exists(page: str) -> None:
    own, wrong = written(page), []
    for language, path, text in blocks(page):
        if language != "python":
            continue
        tree = ast.parse(text, filename=f"{page}: {path or 'a block'}")  # a SyntaxError names the block
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wrong += [f"import {a.name}" for a in node.names if a.name not in own and not resolves(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module not in own:
                if not resolves(node.module):
                    wrong.append(f"from {node.module} import …: no module {node.module}")
                else:
                    wrong += [f"from {node.module} import {a.name}" for a in node.names
                              if not resolves(node.module, a.name)]  # fmt: skip
    assert not wrong, f"{page}: Python blocks import what does not exist: {wrong}"


@pytest.mark.parametrize("page", PAGES)
def test_every_file_a_page_writes_passes_the_lint_make_test_runs(page: str) -> None:
    """A block written to a file (``python consumers/invoices.py``) passes ruff's check and format
    as the copy that follows the page runs them, where the page's own modules exist (first-party)."""
    ruff, first_party = str(ROOT / ".venv" / "bin" / "ruff"), 'lint.isort.known-first-party=["consumers", "tests"]'
    for language, path, text in blocks(page):
        if language != "python" or not path.endswith(".py"):
            continue
        for command in (["check", "--config", first_party], ["format", "--check"]):
            done = subprocess.run([ruff, *command, "--stdin-filename", path, "-"], input=text, cwd=ROOT,
                                  capture_output=True, text=True)  # fmt: skip
            assert done.returncode == 0, f"{page}, {path}: ruff {command[0]}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("page", PAGES)
def test_every_runnable_block_runs(page: str) -> None:
    """A block fenced ```python run``` is a whole example (an in-memory store, its own asserts):
    it runs as a user would paste it, in a namespace of its own."""
    for n, (language, label, text) in enumerate(blocks(page)):
        if language == "python" and label == "run":
            exec(compile(text, f"{page}: runnable block {n}", "exec"), {"__name__": f"docs_block_{n}"})


@pytest.mark.parametrize("page", PAGES)
def test_every_command_named_exists(page: str) -> None:
    made, wrong = targets(), []
    for snippet in code(page):
        for match in COMMAND.finditer(snippet):
            module, words = match.groups()
            if module is not None and not resolves(module):
                wrong.append(f"python -m {module}: no such module")
            elif words is not None and match.group(0).lstrip(" ;&|(").startswith("make"):
                wrong += [f"make {w}: no such target" for w in words.split() if "=" not in w and w not in made]
    assert not wrong, f"{page}: {sorted(set(wrong))}"


@pytest.mark.parametrize("page", PAGES)
def test_every_dotted_name_of_the_project_resolves(page: str) -> None:
    own = written(page)
    text = (ROOT / page).read_text()
    wrong = sorted(
        {name for name in DOTTED.findall(text) if name not in own and not name.endswith(FILES) and not dotted(name)}
    )
    assert not wrong, f"{page} names what does not exist: {wrong}"


@pytest.mark.parametrize("page", PAGES)
def test_every_name_said_to_come_from_a_module_is_there(page: str) -> None:
    wrong = []
    for paragraph in FENCE.sub("", (ROOT / page).read_text()).split("\n\n"):
        flat = " ".join(paragraph.split())
        start = 0
        for match in CLAIM.finditer(flat):
            module = match.group(1) or match.group(2)
            clause = re.split(r"[.;:—]\s|\bfrom `|\(`", flat[start : match.start()])[-1]
            start = match.end()
            if not resolves(module):
                continue  # a dotted name that does not resolve fails the test above
            wrong += [f"{name} from {module}" for name in NAME.findall(clause)
                      if name.isidentifier() and not resolves(module, name)]  # fmt: skip
    assert not wrong, f"{page} says these come from where they are not: {wrong}"
