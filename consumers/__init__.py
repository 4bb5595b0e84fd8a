"""The app's consumers: one module each, a Functions Blueprint ``bp`` with its triggers
and the consumer they use. function_app.py registers every module of this package, so a
new consumer is a new module here (README, "Add your own consumer")."""

from __future__ import annotations

import importlib
import pkgutil

import azure.functions as func


def blueprints() -> list[func.Blueprint]:
    """The ``bp`` of every module of this package, in name order."""
    modules = sorted(info.name for info in pkgutil.iter_modules(__path__))
    return [importlib.import_module(f"{__name__}.{name}").bp for name in modules]
