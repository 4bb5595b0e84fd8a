"""`make test-adopters`: the template as its adopters change it. Each change is made in a copy
of the repository (the files a fresh clone has, plus those not yet committed, committed anew in
the copy; .venv, .venv-checkov, lab/node_modules and the worker's .runtime linked, not rebuilt):

- ``walkthrough``: every walkthrough (``WALKTHROUGHS``: README "Start your own app", and
  docs/triggers.md's Event Grid consumer, Storage queue consumer and HTTP route), every block
  applied literally (under another name where the app has a consumer of that name);
- ``own-names``: a name of the adopter's own in every ``var app… = []`` list of main.bicep, and
  consumers (and their tests) of the adopter's own under every walkthrough's file names;
- ``recipes``: every recipe switched on, ``make recipe NAME=<name>`` each;
- ``without-example``: ``make remove-example``.

Then, in each copy: the library's tests collected must be the template's, one for one; ``make
test`` (the adopter's loop: lint, types, the checks, every test not marked long, the adopter's
own among them) must pass, and so must the walkthroughs' tests (long: each walkthrough applied
to a copy of the changed app).

    python -m lab.adopters [--keep DIR] [walkthrough|own-names|recipes|without-example ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = (".venv", ".venv-checkov", "lab/node_modules", ".runtime")  # installed once, shared by the copies
INSTALLED = (".venv/.installed", "lab/node_modules/.installed", ".venv-checkov/.installed")  # make: as they are
LIBRARY_TESTS = ("tests/unit", "tests/infra", "tests/integration", "tests/runtime", "tests/chaos")
WALKTHROUGH_TESTS = "tests/integration/test_readme_walkthrough.py"  # long: make test leaves them out
WALKTHROUGHS = (
    ("README.md", "## Start your own app"),
    ("docs/triggers.md", "## Add an Event Grid consumer"),
    ("docs/triggers.md", "## Add a Storage queue consumer"),
    ("docs/triggers.md", "## Add an HTTP route"),
)
APP_LIST = re.compile(r"^var (app\w+) = \[(.*?)\]$", re.MULTILINE | re.DOTALL)  # a list of the app's own entities
BLOCK = re.compile(r"^```(\w+) (\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


# -- the walkthroughs ------------------------------------------------------------------------------


class NotApplicable(Exception):
    """The app has a file of its own where a walkthrough writes one: it cannot be followed literally."""


def walkthrough(page: Path, title: str) -> list[tuple[str, str, str]]:
    """(language, file, text) of every fenced block of the section that names a file, in order."""
    text = page.read_text()
    if title not in text:
        raise ValueError(f"{page.name} has no section {title!r}")
    return BLOCK.findall(text.split(title, 1)[1].split("\n## ", 1)[0])


def apply(tree: Path, language: str, path: str, text: str) -> bool:
    """Apply one block to ``tree``; False when the tree holds it already (an app that followed
    the walkthrough), and it is left as it is. NotApplicable when the app has its own file there."""
    target = tree / path
    if language == "python":
        if target.exists():
            if target.read_text() != text:
                raise NotApplicable(f"{path} is this app's own, not the walkthrough's")
            return False
        target.write_text(text)
    elif language == "diff" and (names := app_list_names(text)):
        return append_to_app_list(target, *names)
    elif language == "diff":
        lines = text.splitlines()
        old = "".join(line[1:] + "\n" for line in lines if line.startswith("-"))
        new = "".join(line[1:] + "\n" for line in lines if line.startswith("+"))
        content = target.read_text()
        if content.count(new) == 1:
            return False
        if content.count(old) != 1:  # the app changed these lines (the example's own test: drift)
            raise NotApplicable(f"the walkthrough's diff of {path} does not apply to this app's:\n{old}")
        target.write_text(content.replace(old, new))
    elif language == "json":  # a queue of the Service Bus emulator's config
        config = json.loads(target.read_text())
        queues = config["UserConfig"]["Namespaces"][0]["Queues"]
        queue = json.loads(text)
        if queue["Properties"].keys() != queues[0]["Properties"].keys():
            raise ValueError(f"{path}: the walkthrough's queue does not set every property the others set")
        present = [q for q in queues if q["Name"] == queue["Name"]]
        if present:
            if present != [queue]:
                raise NotApplicable(f"{path} has its own queue {queue['Name']!r}")
            return False
        queues.append(queue)
        target.write_text(json.dumps(config, indent=2) + "\n")
    else:
        raise ValueError(f"a {language} block for {path}: no way to apply it")
    return True


def app_list_names(diff: str) -> tuple[str, list[str]] | None:
    """A diff that sets a list of the app's own entities (``var appQueues = ['invoices']``):
    the list and the names it adds, which the app's list takes beside its own."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+")]
    if len(removed) != 1 or len(added) != 1:
        return None
    before, after = APP_LIST.fullmatch(removed[0]), APP_LIST.fullmatch(added[0])
    if not (before and after and before.group(1) == after.group(1)):
        return None
    names = [
        name
        for name in re.findall(r"'([^']*)'", after.group(2))
        if name not in re.findall(r"'([^']*)'", before.group(2))
    ]
    return after.group(1), names


def append_to_app_list(target: Path, listed: str, names: list[str]) -> bool:
    """``names`` appended to the list ``listed`` of ``target``, whatever it holds; False when they are in it."""
    content = target.read_text()
    found = next((m for m in APP_LIST.finditer(content) if m.group(1) == listed), None)
    if found is None:
        raise NotApplicable(f"{target.name} has no list {listed}")
    present = re.findall(r"'([^']*)'", found.group(2))
    if all(name in present for name in names):
        return False
    items = ", ".join(f"'{name}'" for name in [*present, *(n for n in names if n not in present)])
    target.write_text(content[: found.start()] + f"var {listed} = [{items}]" + content[found.end() :])
    return True


def walkthrough_for(tree: Path, page: str, title: str) -> list[tuple[str, str, str]]:
    """The walkthrough's blocks as ``tree`` can take them: as written, or — where the app has a
    consumer of its own under the walkthrough's name (its module, or the name in its consumers,
    tests or infra's lists) — under the first free name of ``<name>2``, ``<name>3``…, in paths
    and texts alike. A name whose blocks the app holds already is the walkthrough followed."""
    blocks = walkthrough(tree / page, title)
    name = next((Path(path).stem for language, path, _ in blocks if language == "python"
                 and path.startswith("consumers/")), None)  # fmt: skip
    if name is None:
        return blocks
    for candidate in (name, *(f"{name}{n}" for n in range(2, 100))):
        renamed = [(language, _renamed(path, name, candidate), _renamed(text, name, candidate))
                   for language, path, text in blocks]  # fmt: skip
        if _followed(tree, renamed) or not _taken(tree, candidate):
            return renamed
    raise NotApplicable(f"{title}: every name from {name} to {name}99 is this app's own")


def _followed(tree: Path, blocks: list[tuple[str, str, str]]) -> bool:
    """The app followed this walkthrough: each file it writes is there, as it writes it."""
    written = [(tree / path, text) for language, path, text in blocks if language == "python"]
    return all(path.is_file() and path.read_text() == text for path, text in written)


def _taken(tree: Path, name: str) -> bool:
    """``name`` is the app's already: a module of it, or a word of its consumers, tests or infra's lists."""
    if (tree / "consumers" / f"{name}.py").exists():
        return True
    word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", re.IGNORECASE)
    texts = [p.read_text() for p in (*(tree / "consumers").glob("*.py"), *(tree / "tests").glob("test_*.py"))]
    lists = [m.group(2) for m in APP_LIST.finditer((tree / "infra" / "main.bicep").read_text())]
    return any(word.search(text) for text in (*texts, *lists))


def _renamed(text: str, old: str, new: str) -> str:
    for before, after in ((old, new), (old.upper(), new.upper())):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(before)}(?![A-Za-z0-9])", after, text)
    return text


# -- the copies ------------------------------------------------------------------------------------


def copy_tree(target: Path, source: Path = ROOT, *, linked: tuple[str, ...] = LINKED) -> Path:
    """``source`` as a fresh clone has it, with what is not committed yet (files git tracks or
    would), committed anew in ``target``; ``linked`` entries of ``source`` are symlinked."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=source,
                            check=True, capture_output=True, text=True).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)
    git = ["git", "-c", "user.name=template", "-c", "user.email=template@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "the template"]):
        subprocess.run([*git, *args], cwd=target, check=True, capture_output=True)
    for name in linked:  # after the commit: installs are not the repository's
        if (source / name).exists():
            (target / name).symlink_to((source / name).resolve(), target_is_directory=True)
            (target / ".git" / "info").mkdir(exist_ok=True)
            with (target / ".git" / "info" / "exclude").open("a") as exclude:
                exclude.write(f"/{name}\n")
    return target


def make(tree: Path, *targets: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """make in ``tree``, the linked installs taken as they are."""
    stamps = [arg for stamp in INSTALLED for arg in ("-o", stamp)]
    return subprocess.run(["make", "--no-print-directory", *stamps, *targets], cwd=tree, env=_environment(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _environment() -> dict[str, str]:
    """This environment, less what a test run or make set for its own process."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MAKE", "MFLAGS"))}


def _python(tree: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tree / ".venv" / "bin" / "python"), *args], cwd=tree, env=_environment(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _must(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        raise AdopterFailure(f"{what} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


class AdopterFailure(Exception):
    """A step of an adopter path failed."""


# -- the changes ------------------------------------------------------------------------------------


def follow_the_walkthroughs(tree: Path) -> str:
    applied = [apply(tree, *block) for page, title in WALKTHROUGHS for block in walkthrough_for(tree, page, title)]
    return f"{sum(applied)} walkthrough blocks applied ({len(applied) - sum(applied)} there already)"


def switch_every_recipe_on(tree: Path) -> str:
    if not (tree / "recipes").is_dir():
        raise NotApplicable("no recipes/ (the example was removed)")
    listing = "import json, recipes; print(json.dumps([*recipes.MODULES, *recipes.FEATURES]))"
    names = json.loads(_must(_python(tree, "-c", listing), "listing the recipes"))
    for name in names:
        _must(make(tree, "recipe", f"NAME={name}"), f"make recipe NAME={name}")
    return f"switched on: {', '.join(names)}"


def switch_every_recipe_off(tree: Path) -> list[str]:
    """``make recipe-off`` for each recipe infra/recipes.json names; the names switched off."""
    names: list[str] = json.loads((tree / "infra" / "recipes.json").read_text()) if (tree / "recipes").is_dir() else []
    for name in names:
        _must(make(tree, "recipe-off", f"NAME={name}"), f"make recipe-off NAME={name}")
    return names


def remove_the_example(tree: Path) -> str:
    """make remove-example, the recipes that are on switched off first (as its refusal says)."""
    switched_off = switch_every_recipe_off(tree)
    removed = _must(make(tree, "remove-example"), "make remove-example").strip().splitlines()[0]
    return f"switched off: {', '.join(switched_off)}; {removed}" if switched_off else removed


def names_of_your_own(tree: Path) -> str:
    """A name of the adopter's own in every list of the app's own entities main.bicep has; and
    a consumer of the adopter's own, with its test, under each file name a walkthrough writes
    (``consumers/invoices.py``…): the template's tests must leave a user's names alone."""
    bicep = tree / "infra" / "main.bicep"
    listed = [m.group(1) for m in APP_LIST.finditer(bicep.read_text())]
    if not listed:
        raise AdopterFailure("infra/main.bicep has no list of the app's own entities (var app… = [])")
    for name in listed:
        append_to_app_list(bicep, name, [OWN_NAME])
    written = [path for page, title in WALKTHROUGHS for language, path, _ in walkthrough(tree / page, title)
               if language == "python"]  # fmt: skip
    modules = sorted(Path(path).stem for path in written if path.startswith("consumers/"))
    for module in modules:
        (tree / "consumers" / f"{module}.py").write_text(OWN_CONSUMER.format(name=module))
        (tree / "tests" / f"test_{module}.py").write_text(OWN_TEST.format(name=module))
    return f"'{OWN_NAME}' added to {', '.join(listed)}; consumers of its own: {', '.join(modules)}"


OWN_NAME = "adopter-own"
OWN_CONSUMER = '''"""The adopter's own {name}, under the name of a walkthrough's consumer."""

import azure.functions as func

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@bp.function_name("own_{name}")
@bp.route(route="own-{name}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def own_{name}(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("{name}, our own")
'''
OWN_TEST = """from tests.functions import http_request, user_function


def test_our_own_{name}_answers() -> None:
    assert user_function("own_{name}")(http_request(b"", method="GET")).get_body() == b"{name}, our own"
"""
PATHS: dict[str, Callable[[Path], str]] = {
    "walkthrough": follow_the_walkthroughs,
    "own-names": names_of_your_own,
    "recipes": switch_every_recipe_on,
    "without-example": remove_the_example,
}


# -- the checks ------------------------------------------------------------------------------------


def collected(tree: Path, paths: tuple[str, ...] = LIBRARY_TESTS) -> list[str]:
    """The test ids pytest collects under ``paths`` in ``tree``."""
    done = _python(tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *paths, timeout=600)
    return [line for line in _must(done, "pytest --collect-only").splitlines() if "::" in line]


def summary(output: str) -> str:
    """pytest's closing line (``N passed, M skipped in Ts``), stripped of its rules."""
    lines = [line.strip("= ") for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1] if lines else "(no summary)"


def check(tree: Path, library: list[str]) -> str:
    """The library's tests as the template's, make test, the walkthroughs, in the changed ``tree``;
    what they said, in one line."""
    here = collected(tree)
    if sorted(here) != sorted(library):
        missing, extra = sorted(set(library) - set(here)), sorted(set(here) - set(library))
        raise AdopterFailure(
            f"the library's tests differ from the template's: missing {missing[:10]}, new {extra[:10]}"
        )
    tested = _must(make(tree, "test"), "make test")
    jobs = ["-n", os.environ.get("JOBS", "2")]  # one module: its tests spread over the workers
    walked = _must(_python(tree, "-m", "pytest", "-q", "-p", "no:cacheprovider", *jobs, WALKTHROUGH_TESTS), "pytest")
    return (f"{len(here)} library tests collected as in the template; make test: {summary(tested)}; "
            f"the walkthroughs: {summary(walked)}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.adopters", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help=f"of {', '.join(PATHS)} (default: {', '.join(PATHS)})")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="make the copies here and keep them (default: removed)")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.paths if name not in PATHS]:
        parser.error(f"no adopter path {', '.join(unknown)}: choose from {', '.join(PATHS)}")
    base = args.keep or Path(tempfile.mkdtemp(prefix="adopters-"))
    library = collected(ROOT)
    failed: list[str] = []
    try:
        for name in args.paths or PATHS:
            started, tree = time.monotonic(), base / name
            if tree.exists():
                shutil.rmtree(tree)
            tree.mkdir(parents=True)
            try:
                copy_tree(tree)
                changed = PATHS[name](tree)
                verdict = f"OK   {name}: {changed}; {check(tree, library)}"
            except NotApplicable as exc:
                verdict = f"SKIP {name}: {exc}"
            except (AdopterFailure, ValueError, OSError, subprocess.SubprocessError) as exc:
                failed.append(name)
                verdict = f"FAIL {name}: {exc}"
            print(f"{verdict} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
