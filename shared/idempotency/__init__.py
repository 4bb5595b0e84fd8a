"""The dedup module: stable keys, atomic markers, explicit outcomes.

Imports nothing from azure.functions, so that any trigger (or a plain script) can use it.
"""

from .consumer import Delivery, Effects, IdempotentConsumer, Outcome, Result
from .errors import AlreadyClaimed, InvalidMessage, StoreUnavailable, VersionConflict
from .fingerprint import fingerprint
from .keys import DedupKey, cloudevent_identity, from_body_field, from_message_id
from .records import Entity, Marker, State
from .store import CommitResult, CommitStatus, DeadLetter, DedupStore

__all__ = [
    "AlreadyClaimed",
    "CommitResult",
    "CommitStatus",
    "DeadLetter",
    "DedupKey",
    "DedupStore",
    "Delivery",
    "Effects",
    "Entity",
    "IdempotentConsumer",
    "InvalidMessage",
    "Marker",
    "Outcome",
    "Result",
    "State",
    "StoreUnavailable",
    "VersionConflict",
    "cloudevent_identity",
    "fingerprint",
    "from_body_field",
    "from_message_id",
]
