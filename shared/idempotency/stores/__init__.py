"""The stores face: for choosing a store and for writing one (docs/stores.md).

- Choosing: ``app_store`` opens the one the app settings name (``DEDUP_STORE``: ``table``,
  ``cosmos``, a name given to ``register_store``, or ``package.module:factory``);
  ``open_store`` the same for other tables; a ``StoreFactory`` builds one.
- The shipped stores: ``MemoryStore`` (unit tests only), ``TableStore`` (the ``table`` extra)
  and ``CosmosStore`` (the ``cosmos`` extra), the last two imported on first use.
- Writing one: ``DedupStore``, the contract, its abstract primitives (each says what it
  raises) and the decisions built on them; what ``commit_many`` takes and answers
  (``Commit``, ``CommitResult``, ``CommitStatus``, and ``refused`` for data it can never
  hold), what the primitives take (``DedupKey``, ``Entity``; for a store that commits
  changes, each ``Change`` and what ``read_current`` answers, ``Current`` of ``Stored``),
  the records it keeps (``Marker``, ``State``, ``DeadLetter``, ``StoredItem``,
  ``StoredState``, ``StateStatus``, ``Purge``) and the errors it raises (``AlreadyClaimed``,
  ``VersionConflict``, ``StoreRefused``, ``StoreUnavailable``). So that every store holds
  what the others hold, one layout: ``marker_fields`` and ``marker_from`` (a marker's
  fields and back), ``MARKER_KIND`` and ``GUARD_KIND`` (what ``StoredItem.kind`` says),
  ``marker_id``, ``guard_id`` and ``encode_key`` (ids that never collide, whatever the key),
  ``kept`` (a dead letter as stored: its body whole up to ``MAX_DEAD_LETTER_BODY``),
  ``dead_letter_fields`` and ``dead_letter_from``, ``state_fingerprint`` (stored with a
  versioned state) and ``check_storable`` (the values every store holds). A store is done
  when it passes ``shared.idempotency.testing.StoreContract`` against its real server.

The Azure plumbing (error mapping, transports, client factories, the Table ``$batch`` wire
code) stays private in this package's ``_``-modules: a store of another kind imports none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AlreadyClaimed, StoreRefused, StoreUnavailable, VersionConflict
from ..keys import DedupKey, encode_key, guard_id, marker_id
from ..messages import Change, Entity, Stored
from ._base import DedupStore, check_storable, refused
from ._codec import (
    MAX_DEAD_LETTER_BODY,
    dead_letter_fields,
    dead_letter_from,
    kept,
    marker_fields,
    marker_from,
    state_fingerprint,
)
from ._memory import MemoryStore
from ._records import (
    GUARD_KIND,
    MARKER_KIND,
    Commit,
    CommitResult,
    CommitStatus,
    Current,
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
    "GUARD_KIND",
    "MARKER_KIND",
    "MAX_DEAD_LETTER_BODY",
    "AlreadyClaimed",
    "Change",
    "Commit",
    "CommitResult",
    "CommitStatus",
    "CosmosStore",
    "Current",
    "DeadLetter",
    "DedupKey",
    "DedupStore",
    "Entity",
    "Marker",
    "MemoryStore",
    "Purge",
    "State",
    "StateStatus",
    "StoreFactory",
    "StoreRefused",
    "StoreUnavailable",
    "Stored",
    "StoredItem",
    "StoredState",
    "TableStore",
    "VersionConflict",
    "app_store",
    "check_storable",
    "dead_letter_fields",
    "dead_letter_from",
    "encode_key",
    "guard_id",
    "kept",
    "marker_fields",
    "marker_from",
    "marker_id",
    "open_store",
    "refused",
    "register_store",
    "state_fingerprint",
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
