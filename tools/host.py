"""Call the real function app the way the Functions host does, without the host: find
functions through ``app.get_functions()`` and invoke them with real binding objects."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage

import consumers
import function_app
import recipes
from shared.idempotency.functions import housekeeping
from shared.idempotency.functions._timers import NEEDS


@functools.cache
def indexed() -> tuple[Any, ...]:
    """The app's functions as the worker's indexing sees them, and every recipe's that is not
    switched on (an app with all of them, for their tests). get_functions() validates the app
    and may only be called once per app object."""
    everything = func.FunctionApp()
    switched_on = set(consumers.modules())
    for blueprint in [*consumers.blueprints(), *(m.bp for m in recipes.every() if m not in switched_on),
                      *housekeeping(NEEDS)]:  # fmt: skip
        everything.register_functions(blueprint)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it warns that auth levels apply to HTTP functions only
    try:
        function_app.app.get_functions()  # the app itself must index
        return tuple(everything.get_functions())
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
