"""The app's consumers: one module each, a Functions Blueprint ``bp`` with its triggers and
the consumer they use, and the housekeeping its consumers need (``NEEDS``: "steps",
"outbox"; none by default). function_app.py registers every module of this package, so a new
consumer is a new module here (README, "Start your own app"), and a recipe is switched on by
moving its module here (recipes/README.md)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import azure.functions as func


def modules() -> list[ModuleType]:
    """Every module of this package, in name order."""
    return [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(
        pkgutil.iter_modules(__path__), key=lambda info: info.name)]  # fmt: skip


def blueprints() -> list[func.Blueprint]:
    """The ``bp`` of every module of this package, in name order."""
    return [module.bp for module in modules()]


def needs() -> set[str]:
    """What the modules' consumers need of the store's housekeeping."""
    return {need for module in modules() for need in getattr(module, "NEEDS", ())}
