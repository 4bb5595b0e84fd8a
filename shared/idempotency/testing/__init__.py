"""The testing face (the ``testing`` extra: pytest): ``prove`` (a consumer of the app, proven
exactly once in effect under its broker's semantics and faults, against your invariant: the
``proof`` module, docs/testing.md) with ``Message``, ``Faults``, ``Broker`` (the queue's settings),
``Proof``, ``Verdict``, and what an invariant is given, ``Accepted`` and ``Stored``; ``Azurite``
(a real one on a free port, its data in memory or in a folder); ``StoreContract``, the contract suite
every store — the shipped ones, and yours — passes against its real server, with
``in_progress`` (a claim, as its tests build one); the read-back helpers tests and checkers
use: ``entities`` (the stored business entities) and ``marker_keys`` (the stored markers'
keys); and, for the shipped stores' own tests, what they keep beside the data —
``dead_letter_table`` (a Table store's dead-letter table client), ``expiry_index`` (its
expiry index), ``pending_expiry_notes`` (the notes it holds unwritten), ``expiry_hour`` (the
hour a note is filed under), ``commits_lean`` (whether it commits the lean way) — and the
seams they step in by: ``submit_transaction`` (one transaction, as the store submits a
commit's), ``transactions_intercepted`` (recorded, never sent), ``dead_letter_entities_edited``
(a record's entities changed before they are sent), ``refused_expiry_rows`` (index rows refused),
``forget_expiry_notes`` and ``hold_expiry_notes`` (notes lost, or held again),
``flush_expiry_notes`` (every store's notes written now, before counting requests),
``wrapped_handler`` (a consumer's handler wrapped) and ``store_names_restored`` (names given
to ``register_store`` forgotten). The app's consumers, rebuilt or run on a store or sender of
a test's choosing: ``reset``, ``using_store``, ``using_sender``, ``app_settings`` (settings set
while open, the consumers rebuilt) and ``fresh_app`` (the app on new tables of an Azurite); and the
message a Service Bus trigger passes a function, ``servicebus_message`` (with the ``functions`` extra).
Never used on the message path."""

import importlib
from typing import TYPE_CHECKING, Any

from ._contract import StoreContract, in_progress
from ._read_back import (
    commits_lean,
    dead_letter_table,
    entities,
    expiry_hour,
    expiry_index,
    marker_keys,
    pending_expiry_notes,
)
from ._seams import (
    dead_letter_entities_edited,
    flush_expiry_notes,
    forget_expiry_notes,
    hold_expiry_notes,
    refused_expiry_rows,
    store_names_restored,
    submit_transaction,
    transactions_intercepted,
    wrapped_handler,
)
from ._terms import Accepted, Broker, Faults, Message, Stored, Verdict
from .azurite import Azurite
from .proof import Proof, prove

if TYPE_CHECKING:
    from ..functions._app import reset, using_sender, using_store
    from ..functions._bindings import servicebus_message
    from ..functions._test_app import app_settings, fresh_app

_APP_HOOKS = {
    "reset": "_app",
    "using_sender": "_app",
    "using_store": "_app",
    "servicebus_message": "_bindings",
    "app_settings": "_test_app",
    "fresh_app": "_test_app",
}


def __getattr__(name: str) -> Any:
    """The app hooks on first use: they need the Functions face (``azure.functions``), which a
    store's own contract tests do not."""
    if name in _APP_HOOKS:
        return getattr(importlib.import_module(f"..functions.{_APP_HOOKS[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Accepted",
    "Azurite",
    "Broker",
    "Faults",
    "Message",
    "Proof",
    "StoreContract",
    "Stored",
    "Verdict",
    "app_settings",
    "commits_lean",
    "dead_letter_entities_edited",
    "dead_letter_table",
    "entities",
    "expiry_hour",
    "expiry_index",
    "flush_expiry_notes",
    "forget_expiry_notes",
    "fresh_app",
    "hold_expiry_notes",
    "in_progress",
    "marker_keys",
    "pending_expiry_notes",
    "prove",
    "refused_expiry_rows",
    "reset",
    "servicebus_message",
    "store_names_restored",
    "submit_transaction",
    "transactions_intercepted",
    "using_sender",
    "using_store",
    "wrapped_handler",
]
