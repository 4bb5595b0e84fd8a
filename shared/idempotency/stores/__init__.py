"""The stores face: for choosing a store and for writing one.

- ``DedupStore``: the contract, its abstract primitives and the decisions built on them, with
  what ``commit_many`` takes and answers (``Commit``, ``CommitResult``, ``CommitStatus``), the
  records it keeps (``Marker``, ``State``, ``DeadLetter``, ``StoredItem``, ``StoredState``,
  ``StateStatus``, ``Purge``) and the errors it raises (``AlreadyClaimed``, ``VersionConflict``,
  ``StoreRefused``, ``StoreUnavailable``). A store is done when it passes
  ``shared.idempotency.testing.StoreContract`` against its real server.
- The shipped stores: ``MemoryStore`` (unit tests only), ``TableStore`` (the ``table`` extra)
  and ``CosmosStore`` (the ``cosmos`` extra), the last two imported on first use.

The Azure plumbing (error mapping, transports, the Table ``$batch`` wire code) stays private
in this package's ``_``-modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AlreadyClaimed, StoreRefused, StoreUnavailable, VersionConflict
from ..records import Marker, State, StoredItem
from ._base import Commit, CommitResult, CommitStatus, DeadLetter, DedupStore, Purge, StateStatus, StoredState
from ._memory import MemoryStore

if TYPE_CHECKING:  # at run time, on first use (__getattr__ below)
    from ._cosmos import CosmosStore
    from ._table import TableStore

__all__ = [
    "AlreadyClaimed",
    "Commit",
    "CommitResult",
    "CommitStatus",
    "CosmosStore",
    "DeadLetter",
    "DedupStore",
    "Marker",
    "MemoryStore",
    "Purge",
    "State",
    "StateStatus",
    "StoreRefused",
    "StoreUnavailable",
    "StoredItem",
    "StoredState",
    "TableStore",
    "VersionConflict",
]


def __getattr__(name: str) -> Any:
    """TableStore and CosmosStore on first use: each needs its SDK (an optional extra)."""
    if name == "TableStore":
        from ._table import TableStore

        return TableStore
    if name == "CosmosStore":
        from ._cosmos import CosmosStore

        return CosmosStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
