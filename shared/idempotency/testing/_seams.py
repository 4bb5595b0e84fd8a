"""Where tests of the shipped stores and of the consumer step inside them: a fault injected,
a transaction intercepted or submitted alone, index rows refused or notes lost. Each is
undone when its block closes (the context managers) or changes only the object it is given.
Never used on the message path."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..stores import register_store
from ._read_back import PendingNotes

if TYPE_CHECKING:  # the Table store needs its SDK (the ``table`` extra): imported by who passes one
    from ..consumer import Handler, IdempotentConsumer
    from ..stores._table import TableStore
    from ..stores._table_batch import TransactionFailure


def submit_transaction(store: TableStore, operations: list[Any]) -> TransactionFailure | list[str]:
    """One transaction submitted as a Table store submits a commit's, on its path (lean or
    the SDK's), where both paths' answers meet: each operation's ETag when applied, or the
    refused operation (a ``TransactionFailure``: index, status, code); other errors raise,
    unmapped (map them with ``store_errors`` as the store does). ``operations``: the SDK's
    operation tuples, or bare entities for inserts."""
    return store._submit(operations)


@contextmanager
def transactions_intercepted(store: TableStore) -> Iterator[list[list[Any]]]:
    """While open, every transaction a Table store would submit is recorded in the list
    yielded instead of sent (and answers nothing): to show that nothing is sent."""
    sent: list[list[Any]] = []

    def record(operations: list[Any]) -> Any:
        sent.append(operations)

    store._submit = record  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del store._submit  # the class's own again


@contextmanager
def dead_letter_entities_edited(store: TableStore, edit: Callable[[list[dict[str, Any]]], None]) -> Iterator[None]:
    """While open, the entities a Table store writes for a dead-letter record (the record's,
    then its parts) are built as usual, then changed by ``edit`` before they are sent: to
    have the service refuse one of them."""
    build = store._dead_letter_entities

    def edited(record: Any) -> list[dict[str, Any]]:
        entities = build(record)
        edit(entities)
        return entities

    store._dead_letter_entities = edited  # type: ignore[method-assign]
    try:
        yield
    finally:
        del store._dead_letter_entities


@contextmanager
def refused_expiry_rows(store: TableStore, error: Exception) -> Iterator[list[dict[str, Any]]]:
    """While open, every expiry index row a Table store writes is refused with ``error`` (the
    service's answer, a 409 TableBeingDeleted say) instead of written; the rows refused are
    recorded in the list yielded."""
    index = store._expiry
    refused: list[dict[str, Any]] = []
    writes = index._writes

    class Refusing:
        def insert(self, row: dict[str, Any], **options: Any) -> str | None:
            refused.append(row)
            raise error

        def __getattr__(self, name: str) -> Any:  # the rest as the store's transport
            return getattr(writes, name)

    index._writes = Refusing()  # type: ignore[assignment]
    try:
        yield refused
    finally:
        index._writes = writes


def forget_expiry_notes(store: TableStore) -> None:
    """Drop the expiry notes a Table store holds in memory, unwritten: what an instance that
    stops before its next flush loses (the full sweep, ``sweep_expired``, finds those markers)."""
    with store._expiry._mutex:
        store._expiry._pending.clear()


def hold_expiry_notes(store: TableStore, notes: PendingNotes) -> None:
    """Hold ``notes`` (``pending_expiry_notes``) in a Table store's memory again, to be written
    by its next flush: what a row write whose answer was lost does."""
    with store._expiry._mutex:
        for hour, held in notes.items():
            store._expiry._pending.setdefault(hour, []).extend(held)


def flush_expiry_notes() -> int:
    """Write now the expiry notes every Table store of this process holds (requests made), as
    their timers would within a minute: a count of store requests that follows (the
    ``dedup.store.requests`` metric is the process's) then holds no other store's flush."""
    from ..stores import _expiry  # the Table store's SDK: only where a Table store exists

    return sum(index.flush() for index in list(_expiry._live))


@contextmanager
def wrapped_handler(consumer: IdempotentConsumer, wrap: Callable[[Handler], Handler]) -> Iterator[None]:
    """While open, the consumer calls ``wrap(its handler)`` in its handler's place: a bug or a
    crash injected around the real handler."""
    handler = consumer._handler
    consumer._handler = wrap(handler)
    try:
        yield
    finally:
        consumer._handler = handler


@contextmanager
def store_names_restored() -> Iterator[None]:
    """Names given to ``register_store`` while open are forgotten when it closes (and a name
    registered again gets its earlier factory back): a test's registrations stay its own."""
    factories = sys.modules[register_store.__module__]._factories
    saved = dict(factories)
    try:
        yield
    finally:
        factories.clear()
        factories.update(saved)
