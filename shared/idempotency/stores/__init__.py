"""The stores face: for choosing a store and for writing one.

- Choosing: ``app_store`` opens the one the app settings name (``DEDUP_STORE``: ``table``,
  ``cosmos``, a name given to ``register_store``, or ``package.module:factory``);
  ``open_store`` the same for other tables; a ``StoreFactory`` builds one.
- The shipped stores: ``MemoryStore`` (unit tests only), ``TableStore`` (the ``table`` extra)
  and ``CosmosStore`` (the ``cosmos`` extra), the last two imported on first use.
- Writing one: ``DedupStore``, the contract, its abstract primitives (each says what it
  raises) and the decisions built on them; what ``commit_many`` takes and answers
  (``Commit``, ``CommitResult``, ``CommitStatus``), the records it keeps (``Marker``,
  ``State``, ``DeadLetter``, ``StoredItem``, ``StoredState``, ``StateStatus``, ``Purge``) and
  the errors it raises (``AlreadyClaimed``, ``VersionConflict``, ``StoreRefused``,
  ``StoreUnavailable``). A store is done when it passes
  ``shared.idempotency.testing.StoreContract`` against its real server.

The Azure plumbing (error mapping, transports, client factories, the Table ``$batch`` wire
code) stays private in this package's ``_``-modules: a store of another kind imports none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AlreadyClaimed, StoreRefused, StoreUnavailable, VersionConflict
from ._base import DedupStore
from ._memory import MemoryStore
from ._records import (
    Commit,
    CommitResult,
    CommitStatus,
    DeadLetter,
    Marker,
    Purge,
    State,
    StateStatus,
    StoredItem,
    StoredState,
)
from ._settings import StoreFactory, app_store, open_store, register_store

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
    "StoreFactory",
    "StoreRefused",
    "StoreUnavailable",
    "StoredItem",
    "StoredState",
    "TableStore",
    "VersionConflict",
    "app_store",
    "open_store",
    "register_store",
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
