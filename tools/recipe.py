"""Switch a recipe on: ``make recipe NAME=<name>`` (or ``python -m tools.recipe <name>``).

Its module moves from recipes/ into consumers/ — the app registers it from there, and it is
yours to change — and its name joins infra/recipes.json, so that the next ``azd up`` (or
Bicep deployment) creates what it needs (recipes/README.md lists them). A feature of the
orders consumers (``outbox``, ``payments``) has no module: its name only, and its setting."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import recipes

ROOT = Path(__file__).resolve().parents[1]
SWITCHES = ROOT / "infra" / "recipes.json"
SETTINGS = {"outbox": "ORDER_ACCEPTED_TOPIC (the topic to publish OrderAccepted to)",
            "payments": "PAYMENT_API_URL (the payment API's base URL)"}  # fmt: skip


def switch_on(name: str, root: Path = ROOT) -> list[str]:
    """Move the recipe's module (git mv inside a git work tree) and record its name; returns
    what was done. ValueError for a name no recipe has."""
    if name not in recipes.MODULES and name not in recipes.FEATURES:
        raise ValueError(f"no recipe {name!r}: choose from {', '.join(sorted([*recipes.MODULES, *recipes.FEATURES]))}")
    done = []
    module = recipes.MODULES.get(name)
    source, target = root / "recipes" / f"{module}.py", root / "consumers" / f"{module}.py"
    if module and source.exists():
        moved = subprocess.run(["git", "mv", str(source), str(target)], cwd=root, capture_output=True)
        if moved.returncode != 0:  # not a git work tree (an unpacked copy): a plain move
            source.rename(target)
        done.append(f"moved recipes/{module}.py to consumers/")
    switches = root / SWITCHES.relative_to(ROOT)
    names = json.loads(switches.read_text()) if switches.exists() else []
    if name not in names:
        switches.write_text(json.dumps(sorted([*names, name]), indent=2) + "\n")
        done.append(f"added {name!r} to infra/recipes.json")
    if name in SETTINGS:
        done.append(f"set {SETTINGS[name]} in local.settings.json (infra sets it on Azure)")
    return done or [f"{name!r} is on already"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the recipe's name (recipes/README.md)")
    try:
        done = switch_on(parser.parse_args(argv).name)
    except ValueError as exc:
        parser.exit(2, f"recipe: {exc}\n")
    print("\n".join(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
