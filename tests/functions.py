"""Drive the real function app as the Functions host would: find a function through
``app.get_functions()`` and call its user function with real binding objects."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import azure.functions as func
from azure.functions.servicebus import ServiceBusMessage

import function_app


def user_function(name: str) -> Callable[..., Any]:
    for fn in function_app.app.get_functions():
        if fn.get_function_name() == name:
            return fn.get_user_function()
    raise LookupError(f"no function named {name}")


def servicebus_message(
    body: bytes | dict[str, Any], message_id: str | None, *, delivery_count: int = 1, correlation_id: str | None = None
) -> func.ServiceBusMessage:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return ServiceBusMessage(
        body=raw,
        message_id=message_id,  # type: ignore[arg-type]  # the host passes None when absent
        correlation_id=correlation_id,
        delivery_count=delivery_count,
        content_type="application/json",
        application_properties={},
        user_properties={},
    )


@contextmanager
def app_settings(**settings: str) -> Iterator[None]:
    """Point the app at a store; its consumers are rebuilt from these settings."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    function_app.order_consumer.cache_clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        function_app.order_consumer.cache_clear()
