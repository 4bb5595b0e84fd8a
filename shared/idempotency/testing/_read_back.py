"""What tests and checkers read back from a store: business entities and markers, from
``DedupStore.scan``; and, for tests of the shipped stores, what the stores keep beside the
data (a Table store's dead-letter table, its expiry index and the notes it holds, which
path its transactions take). Never used on the message path."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..keys import DedupKey
from ..stores._base import DedupStore

if TYPE_CHECKING:  # the Table store needs its SDK (the ``table`` extra): imported by who passes one
    from azure.data.tables import TableClient

    from ..stores._expiry import ExpiryIndex, Note
    from ..stores._table import TableStore

PendingNotes = dict[str, list[tuple["Note", datetime]]]  # by the hour (YYYYMMDDHH) the markers expire


def entities(store: DedupStore, name: str | None = None, partition: str | None = None) -> list[dict[str, Any]]:
    """The stored business entities (named ``name``, of ``partition``), markers and guards left out."""
    return [item.data for item in store.scan(partition) if item.entity is not None and name in (None, item.entity)]


def marker_keys(store: DedupStore, partition: str | None = None) -> list[DedupKey]:
    """The keys of the stored markers, sorted."""
    return sorted(item.key for item in store.scan(partition) if item.key is not None)


def dead_letter_table(store: TableStore) -> TableClient:
    """The client of a Table store's dead-letter table: its records' entities and their parts
    as stored (``TableStore.dead_letters`` reads them back as records)."""
    return store._dead


def expiry_index(store: TableStore) -> ExpiryIndex:
    """A Table store's expiry index (stores/_expiry.py): ``flush()`` writes the notes it holds
    in memory as index rows now, and answers the requests made."""
    return store._expiry


def pending_expiry_notes(store: TableStore) -> PendingNotes:
    """A copy of the expiry notes a Table store holds in memory, not yet written as index
    rows, by the hour their markers expire."""
    with store._expiry._mutex:
        return {hour: list(notes) for hour, notes in store._expiry._pending.items()}


def expiry_hour(moment: datetime) -> str:
    """The hour (``YYYYMMDDHH``, UTC) a note of a marker expiring at ``moment`` (an aware
    time) is filed under."""
    from ..stores._expiry import _hour_of

    return _hour_of(moment)


def commits_lean(store: TableStore) -> bool:
    """Whether a Table store commits through the lean transaction path (stores/_table_batch.py)
    rather than the SDK's ``submit_transaction``."""
    from ..stores._table_batch import TableTransactions

    return isinstance(store._transactions, TableTransactions)
