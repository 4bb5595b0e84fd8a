"""Call the real function app the way the Functions host does, without the host: find
functions through ``app.get_functions()`` and invoke them with real binding objects."""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from types import ModuleType
from typing import Any

import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage

import consumers
import function_app
from shared.idempotency.functions import housekeeping
from shared.idempotency.functions._housekeeping import NEEDS
from shared.idempotency.testing import reset


@contextmanager
def app_settings(**settings: str) -> Iterator[None]:
    """Point the app at a store; its consumers are rebuilt from these settings."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    reset()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reset()


def others() -> list[ModuleType]:
    """The modules whose functions tests call beside the app's: every recipe not switched on
    and the library tests' own consumers (tests/app.py), where they are (an app without the
    example has neither recipes/ nor, perhaps, tests)."""
    found = []
    if find_spec("recipes") is not None:
        found += importlib.import_module("recipes").every()
    if find_spec("tests") is not None and find_spec("tests.app") is not None:
        found.append(importlib.import_module("tests.app"))
    switched_on = set(consumers.modules())
    return [module for module in found if module not in switched_on]


_indexing = threading.Lock()


def indexed() -> tuple[Any, ...]:
    """The app's functions as the worker's indexing sees them, with those of ``others()`` and
    every housekeeping timer (an app with all of them, for their tests). get_functions()
    validates the app and may only be called once per app object: the first callers of
    several threads (the harness's competing workers) wait for one indexing."""
    with _indexing:
        return _indexed()


@functools.cache
def _indexed() -> tuple[Any, ...]:
    everything = func.FunctionApp()
    for blueprint in [*consumers.blueprints(), *(m.bp for m in others()), *housekeeping(NEEDS)]:
        everything.register_functions(blueprint)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it warns that auth levels apply to HTTP functions only
    try:
        function_app.app.get_functions()  # the app itself must index
        try:
            return tuple(everything.get_functions())
        except ValueError as clash:  # "Function items does not have a unique function name"
            beside = ", ".join(m.__name__ for m in others())
            raise ValueError(f"{clash}: a function of consumers/ has the name of one in {beside}: rename it") from None
    finally:
        root.setLevel(level)


@functools.cache
def _functions() -> dict[str, Callable[..., Any]]:
    return {str(fn.get_function_name()): fn.get_user_function() for fn in indexed()}


def user_function(name: str) -> Callable[..., Any]:
    try:
        return _functions()[name]
    except KeyError:
        raise LookupError(f"function_app has no function named {name!r}") from None


def servicebus_message(
    body: bytes | dict[str, Any],
    message_id: str | None,
    *,
    delivery_count: int = 1,
    correlation_id: str | None = None,
) -> func.ServiceBusMessage:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return ServiceBusMessage(
        body=raw,
        message_id=message_id,  # type: ignore[arg-type]  # the host passes None when the producer set none
        correlation_id=correlation_id,
        delivery_count=delivery_count,
        content_type="application/json",
        application_properties={},
        user_properties={},
    )


def cloudevent(data: dict[str, Any], *, source: str, event_id: str, event_type: str,
               subject: str | None = None) -> func.CloudEvent:  # fmt: skip
    """An Event Grid CloudEvent as the trigger passes it. The consumer's payload (what its
    schema validates, its key source reads, its handler gets) is the envelope
    ``{"type", "subject", "data"}``; its key is (source, id)."""
    return func.CloudEvent(id=event_id, source=source, type=event_type, specversion="1.0", data=data,
                           subject=subject)  # fmt: skip
