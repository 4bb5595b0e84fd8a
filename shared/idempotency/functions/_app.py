"""The app's consumers, each declared in the module of its functions and built on first
use from the app settings; all of them share one store (their names scope their keys).

    @consumer
    def invoices() -> IdempotentConsumer:
        return IdempotentConsumer("invoices", shared_store(), on_invoice, schema=SCHEMA)

``invoices()`` then returns the same consumer on every call, until ``reset()`` — after
the settings changed, in tests and tools — rebuilds them all. ``using_store(store)`` runs
every consumer on a store of your choice (an in-memory one in unit tests).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, TypeVar

from ..audit import audited
from ..config import (
    DEFAULT_OUTBOX_SWEEP_BUDGET,
    DEFAULT_PURGE_BUDGET,
    DEFAULT_PURGE_TIME,
    dead_letter_retention,
    duration,
    problems,
    whole,
)
from ..consumer import IdempotentConsumer
from ..errors import ConfigurationError
from ..imports import max_bytes_setting
from ..outbox import Sender
from ..stores._base import DedupStore
from ..stores._settings import app_store, check_store_settings
from ._senders import app_sender, check_sender_settings

T = TypeVar("T")
C = TypeVar("C", bound=IdempotentConsumer)


class Once(Generic[T]):
    """``build()`` called at most once until ``clear()``, however many threads ask at once
    (a cold instance receives up to 16 calls together: one store, one credential, one pool)."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self.module: str = getattr(build, "__module__", "")  # where it is declared
        self.name: str = getattr(build, "__name__", "")  # the function that declares it
        self._lock = threading.Lock()
        self._built: list[T] = []

    def __call__(self) -> T:
        if not self._built:
            with self._lock:
                if not self._built:  # another thread may have built it while we waited
                    self._built.append(self._build())
        return self._built[0]

    def clear(self) -> None:
        with self._lock:
            self._built.clear()

    @property
    def built(self) -> list[T]:
        """What it built, if it did."""
        return list(self._built)


_declared: list[Once[IdempotentConsumer]] = []
_substitute: list[DedupStore] = []  # set by using_store()
_app_store = Once(app_store)
_sender_substitute: list[Sender] = []  # set by using_sender()
_app_sender = Once(app_sender)


def consumer(build: Callable[[], C]) -> Callable[[], C]:
    """Declare one of the app's consumers: built once, on first use (a cold instance
    whose store is unreachable fails that call, not the app's import)."""
    once = Once(build)
    _declared.append(once)  # type: ignore[arg-type]  # Once is invariant; it is read as built
    return once


def shared_store() -> DedupStore:
    """The app's store (DEDUP_STORE, DEDUP_TABLE…): one client and connection pool for all."""
    return _substitute[-1] if _substitute else _app_store()


def shared_sender() -> Sender:
    """The app's outbox sender (Service Bus, on the trigger's connection): one client for all."""
    return _sender_substitute[-1] if _sender_substitute else _app_sender()


def declared(module: str | None = None) -> list[IdempotentConsumer]:
    """Every declared consumer, built; with ``module``, those it declares (a package: its
    modules too), after importing it (``declaring``)."""
    if module is not None:
        declaring(module)
    return [build() for build in _declared_in(module)]


def _declared_in(module: str | None) -> list[Once[IdempotentConsumer]]:
    return [build for build in _declared if module is None or build.module == module
            or build.module.startswith(module + ".")]  # fmt: skip


def declaring(module: str) -> None:
    """Import ``module`` and, when it is a package, every module in it, however deep: what a
    fresh process (an operator's tool) must do to see the consumers the app declares, since
    importing a package does not import its modules. ImportError names what failed."""
    found = importlib.import_module(module)
    for info in pkgutil.walk_packages(getattr(found, "__path__", []), prefix=f"{module}."):
        importlib.import_module(info.name)


def declared_consumer(name: str, module: str = "consumers", declared_by: str | None = None) -> IdempotentConsumer:
    """The consumer ``name`` that ``module`` declares (``declaring`` imports it, and every
    module of a package), built: what operators' tools use, never the function app itself.
    Every declared consumer is built: another that cannot be built here (a setting only it
    reads) does not stop the tool. Two of that name (an Event Grid consumer and its HTTP route
    share theirs) are told apart by ``declared_by``, the function that declares the one meant.
    ConfigurationError naming the known ones, and what failed, when none is (or when it is
    ambiguous); ImportError when a module cannot be imported."""
    declaring(module)
    known, failed, found = [], [], []
    for build in _declared_in(module):
        try:
            built = build()
        except ConfigurationError as exc:
            failed.append(str(exc))
            continue
        if built.name == name and declared_by in (None, build.name):
            found.append((build.name, built))
        known.append(built.name)
    if len(found) == 1:
        return found[0][1]
    if found:
        raise ConfigurationError(f"consumer '{name}' is declared by {', '.join(by for by, _ in found)}: name the "
                                 "one meant (--declared FUNCTION)")  # fmt: skip
    why = f" ({len(failed)} could not be built: {failed[0]})" if failed else ""
    which = f" declared by {declared_by}" if declared_by else ""
    raise ConfigurationError(f"no consumer named '{name}'{which} in {module}; known: "
                             f"{', '.join(sorted(set(known)))}{why}")  # fmt: skip


def check_app_settings() -> None:
    """Every setting the app reads, checked without a request: the consumers' options, the
    store's name and what it needs, the outbox sender. One ConfigurationError naming every
    problem, raised when the app starts in a Functions host (function_app.py): indexing fails
    with it in the host log, instead of a healthy-looking app that fails every message."""
    found = problems()
    timers = (lambda: duration("DEDUP_STALE_AFTER", "PT1H"), lambda: whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET),
              lambda: duration("DEDUP_PURGE_TIME", DEFAULT_PURGE_TIME),
              lambda: whole("DEDUP_OUTBOX_SWEEP_BUDGET", DEFAULT_OUTBOX_SWEEP_BUDGET), max_bytes_setting,
              lambda: audited(os.environ.get("DEDUP_AUDIT", "")))  # fmt: skip
    for check in (dead_letter_retention, check_store_settings, check_sender_settings, *timers):
        try:
            check()
        except ConfigurationError as exc:
            found.append(str(exc))
    if found:
        raise ConfigurationError("the app settings are not usable: " + "; ".join(found))


def built(name: str) -> IdempotentConsumer | None:
    """The declared consumer named ``name``, if it was built (the proof kit reads its markers)."""
    return next((c for build in _declared for c in build.built if c.name == name), None)


def reset() -> None:
    """Forget the store and every built consumer: the next use reads the settings again."""
    _app_store.clear()
    _app_sender.clear()
    for build in _declared:
        build.clear()


def using_store(store: DedupStore) -> AbstractContextManager[DedupStore]:
    """Every consumer built inside uses ``store`` instead of the settings' one."""
    return _substituted(_substitute, store)


def using_sender(sender: Sender) -> AbstractContextManager[Sender]:
    """Every consumer built inside sends with ``sender`` (a local topic in tests)."""
    return _substituted(_sender_substitute, sender)


@contextmanager
def _substituted(substitutes: list[T], value: T) -> Iterator[T]:
    reset()
    substitutes.append(value)
    try:
        yield value
    finally:
        substitutes.remove(value)
        reset()
