"""Test helpers around the real function app (see tools/host.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import function_app
from tools.host import servicebus_message, user_function

__all__ = ["app_settings", "servicebus_message", "user_function"]


@contextmanager
def app_settings(**settings: str) -> Iterator[None]:
    """Point the app at a store; its consumers are rebuilt from these settings."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    function_app.consumers.cache_clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        function_app.consumers.cache_clear()
