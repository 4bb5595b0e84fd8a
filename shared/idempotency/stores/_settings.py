"""Choosing the app's store by name, as dogpile.cache chooses a backend: ``DEDUP_STORE`` is
``table`` (default), ``cosmos``, a name given to ``register_store``, or ``package.module:factory``
(a user's own store, imported on first use). A factory takes the markers' and the dead
letters' table (container) names and ``create``, and returns a ``DedupStore``: one that is
not (a class, a value, another signature, another return) is a ``ConfigurationError``."""

from __future__ import annotations

import inspect
from typing import Protocol

from ..config import dead_letter_retention, factory, setting
from ..errors import ConfigurationError
from ._azure import (
    TRANSPORT,
    cosmos_client,
    partition_field,
    store_errors,
    table_account,
    table_service,
    table_transactions,
)
from ._base import DedupStore


class StoreFactory(Protocol):
    def __call__(self, table: str, dead_letter_table: str, *, create: bool) -> DedupStore: ...


def table_store(table: str, dead_letter_table: str, *, create: bool) -> DedupStore:
    """Table Storage (DEDUP_STORAGE_CONNECTION or DEDUP_STORAGE_ENDPOINT), tables created
    if missing unless ``create`` is False (a reader role cannot create tables)."""
    from ._table import TableStore
    from ._table_batch import TableTransactions

    service = table_service()
    transactions = TableTransactions.of(service, table, **TRANSPORT) if table_transactions() == "lean" else None
    store = TableStore(service, table, dead_letter_table, dead_letter_retention=dead_letter_retention(),
                       transactions=transactions)  # fmt: skip
    if create:
        store.create_tables()
    return store


def cosmos_store(table: str, dead_letter_table: str, *, create: bool) -> DedupStore:
    """The COSMOS_CONTAINER container (default: ``table``) of COSMOS_DATABASE, provisioned by
    infra (data-plane roles cannot create containers: ``create`` has nothing to do)."""
    from ._cosmos import CosmosStore

    with store_errors():  # the client and the partition key read go to the service: unreachable is transient
        database = cosmos_client().get_database_client(setting("COSMOS_DATABASE", "dedup"))
        container = database.get_container_client(setting("COSMOS_CONTAINER", table))
        dead_letters = database.get_container_client(setting("COSMOS_DEADLETTER_CONTAINER", dead_letter_table))
        return CosmosStore(container, dead_letters, partition_field(container),
                           dead_letter_retention=dead_letter_retention())  # fmt: skip


_factories: dict[str, StoreFactory] = {"table": table_store, "cosmos": cosmos_store}


def register_store(name: str, factory: StoreFactory) -> None:
    """Make ``DEDUP_STORE=name`` choose ``factory``."""
    _factories[name.lower()] = factory


def open_store(table: str, dead_letter_table: str, *, create: bool = True) -> DedupStore:
    """The store DEDUP_STORE names, for these tables. ``create=False`` for read-only tools."""
    name = setting("DEDUP_STORE", "table")
    factory = _factories.get(name.lower()) or _imported(name)
    store = factory(table, dead_letter_table, create=create)
    if not isinstance(store, DedupStore):
        raise ConfigurationError(f"DEDUP_STORE={name!r}: its factory returned a {type(store).__name__}, not a "
                                 f"DedupStore; it must name {EXPECTED}")  # fmt: skip
    return store


def check_store_settings() -> None:
    """What opening the store would read, read without a request: DEDUP_STORE names a store,
    and the shipped ones have their endpoint (ConfigurationError otherwise)."""
    name = setting("DEDUP_STORE", "table").lower()
    if name == "table":
        table_transactions()
        table_account()
    elif name == "cosmos":
        setting("COSMOS_ENDPOINT")
    elif name not in _factories:
        _imported(setting("DEDUP_STORE", "table"))


def app_store(*, create: bool = True) -> DedupStore:
    """The app's store: DEDUP_TABLE (or COSMOS_CONTAINER) and DEDUP_DEADLETTER_TABLE."""
    return open_store(setting("DEDUP_TABLE", "records"), setting("DEDUP_DEADLETTER_TABLE", "deadletters"),
                      create=create)  # fmt: skip


# What DEDUP_STORE=package.module:name must name: open_store calls it so.
EXPECTED = "a factory `def f(table: str, dead_letter_table: str, *, create: bool) -> DedupStore`"


def _imported(name: str) -> StoreFactory:
    """The factory ``package.module:name`` names, checked before it is ever called: a class
    (whose constructor is not the factory's call), a value, or a function that cannot take
    ``(table, dead_letter_table, create=...)`` is a ConfigurationError naming the setting."""
    try:
        chosen: StoreFactory = factory("DEDUP_STORE", name, ", ".join(sorted(_factories)))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc}; it must name {EXPECTED}") from exc
    if inspect.isclass(chosen):
        raise ConfigurationError(f"DEDUP_STORE={name!r} names a class; it must name {EXPECTED}")
    try:
        signature = inspect.signature(chosen)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call itself will tell
        return chosen
    try:
        signature.bind("records", "deadletters", create=True)
    except TypeError as exc:
        called = "f(table, dead_letter_table, create=...)"
        raise ConfigurationError(f"DEDUP_STORE={name!r}: {signature} cannot be called as {called} ({exc}); "
                                 f"it must name {EXPECTED}") from None  # fmt: skip
    return chosen
