"""Opt-in recipes: every other source and feature the template knows, each a module like
those in consumers/ (a Blueprint ``bp``, its consumers, its ``NEEDS``). A recipe is
switched on by moving its module into consumers/ and naming it in infra/recipes.json —
``make recipe NAME=<name>`` does both (recipes/README.md). Until then the app does not
register it, and infra deploys nothing for it.

``module(name)`` finds a recipe's module wherever it is now, for its tests and tools."""

from __future__ import annotations

import importlib
from importlib.util import find_spec
from types import ModuleType

# recipe name (infra/recipes.json) -> its module (consumers/<module>.py once switched on);
# "outbox" and "payments" are features of the orders consumers, switched on by their settings.
MODULES = {
    "http": "orders_api",
    "cloudevents-http": "events_api",
    "topic": "order_topic",
    "sessions": "order_status",
    "batch": "ledger",
    "balances": "balances",
    "eventhubs": "shipments",
    "schedule": "reminders",
    "queue": "returns",
    "blob-import": "prices",
}
FEATURES = ("outbox", "payments")


def module(name: str) -> ModuleType:
    """The module ``name`` (``shipments``), from consumers/ when switched on, else from here."""
    for package in ("consumers", __name__):
        if find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
    raise ModuleNotFoundError(f"no module {name!r} in consumers/ nor recipes/")


def every() -> list[ModuleType]:
    """Every recipe's module, wherever it is."""
    return [module(name) for name in MODULES.values()]
