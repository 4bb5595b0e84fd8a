"""Switch a recipe on or off: ``make recipe NAME=<name>``, ``make recipe-off NAME=<name>`` (or
``python -m lab.recipe [--off] <name>``).

On: its module moves from recipes/ into consumers/ — the app registers it from there, and it is
yours to change — and its name joins infra/recipes.json, so that the next ``azd up`` (or Bicep
deployment) creates what it needs (recipes/README.md lists them). Off: the module goes back to
recipes/ (with your changes) and the name leaves infra/recipes.json, so that infra no longer
declares what it needs (azd provisions incrementally: what was deployed stays until you delete
it, infra/README.md). A feature of the orders consumers (``outbox``, ``payments``) has no
module: its name only, and its setting."""

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


def switch(name: str, on: bool = True, root: Path = ROOT) -> list[str]:
    """Move the recipe's module (git mv inside a git work tree) and record its name, or undo
    both; returns what was done. ValueError for a name no recipe has."""
    if name not in recipes.MODULES and name not in recipes.FEATURES:
        raise ValueError(f"no recipe {name!r}: choose from {', '.join(sorted([*recipes.MODULES, *recipes.FEATURES]))}")
    done = []
    module = recipes.MODULES.get(name)
    off_place, on_place = root / "recipes" / f"{module}.py", root / "consumers" / f"{module}.py"
    source, target = (off_place, on_place) if on else (on_place, off_place)
    if module and source.exists() and target.exists():
        raise ValueError(f"both {on_place.relative_to(root)} and {off_place.relative_to(root)} exist: keep one")
    if module and source.exists():
        moved = subprocess.run(["git", "mv", str(source), str(target)], cwd=root, capture_output=True)
        if moved.returncode != 0:  # not a git work tree (an unpacked copy), or not tracked: a plain move
            source.rename(target)
        done.append(f"moved {source.relative_to(root)} to {target.parent.relative_to(root)}/")
    switches = root / SWITCHES.relative_to(ROOT)
    names = json.loads(switches.read_text()) if switches.exists() else []
    if (name in names) != on:
        kept = sorted([*names, name]) if on else [n for n in names if n != name]
        switches.write_text(json.dumps(kept, indent=2) + "\n")
        done.append(f"{'added' if on else 'removed'} {name!r} {'to' if on else 'from'} infra/recipes.json")
    if name in SETTINGS and done:
        setting = SETTINGS[name]
        done.append(f"set {setting} in local.settings.json (infra sets it on Azure)" if on else
                    f"remove {setting.split()[0]} from local.settings.json (infra no longer sets it)")  # fmt: skip
    return done or [f"{name!r} is {'on' if on else 'off'} already"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the recipe's name (recipes/README.md)")
    parser.add_argument("--off", action="store_true", help="switch it off")
    args = parser.parse_args(argv)
    try:
        done = switch(args.name, on=not args.off)
    except ValueError as exc:
        parser.exit(2, f"recipe: {exc}\n")
    print("\n".join(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
