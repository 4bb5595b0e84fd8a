"""The app in a test (exported by the testing face): ``app_settings`` (app settings set, the
consumers rebuilt from them) and ``fresh_app`` (the app on new tables of an Azurite)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from ._app import reset


class Storage(Protocol):
    @property
    def connection_string(self) -> str: ...


@contextmanager
def app_settings(**settings: str) -> Iterator[None]:
    """These app settings while open, every consumer rebuilt from them; the earlier ones after."""
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


@contextmanager
def fresh_app(azurite: Storage, **settings: str) -> Iterator[str]:
    """The app on new tables of this Azurite, so that tests never see each other's data;
    yields the table name. A transient failure goes back to the broker at once
    (DEDUP_TRANSIENT_WAIT=PT0S) unless a test sets the wait it is about."""
    table = "t" + uuid.uuid4().hex[:16]
    with app_settings(DEDUP_STORAGE_CONNECTION=azurite.connection_string, DEDUP_TABLE=table,
                      DEDUP_DEADLETTER_TABLE=table + "dl", **{"DEDUP_TRANSIENT_WAIT": "PT0S", **settings}):  # fmt: skip
        yield table
