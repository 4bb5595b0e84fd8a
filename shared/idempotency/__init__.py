"""The dedup module: stable keys, atomic markers, explicit outcomes.

Imports nothing from azure.functions, so that any trigger (or a plain script) can use it.
"""

from .consumer import Delivery, Effects, Handler, IdempotentConsumer, LatestState, Outcome, Result
from .errors import (
    AlreadyClaimed,
    ConfigurationError,
    DedupError,
    DownstreamRejected,
    DownstreamUnavailable,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    StoreUnavailable,
    VersionConflict,
)
from .keys import DedupKey, cloudevent_identity, from_body_field, from_message_id, joined_identity
from .payload import fingerprint, parse_json
from .records import Entity, Marker, State
from .steps import Context, StepPolicy
from .stores._base import Commit, CommitResult, CommitStatus, DeadLetter, DedupStore, StoredState

__all__ = [
    "AlreadyClaimed",
    "Commit",
    "CommitResult",
    "CommitStatus",
    "ConfigurationError",
    "Context",
    "DeadLetter",
    "DedupError",
    "DedupKey",
    "DedupStore",
    "Delivery",
    "DownstreamRejected",
    "DownstreamUnavailable",
    "Effects",
    "Entity",
    "FingerprintMismatch",
    "Handler",
    "IdempotentConsumer",
    "InFlight",
    "InvalidMessage",
    "LatestState",
    "LeaseLost",
    "Marker",
    "Outcome",
    "Result",
    "State",
    "StepPolicy",
    "StoreUnavailable",
    "StoredState",
    "VersionConflict",
    "cloudevent_identity",
    "fingerprint",
    "from_body_field",
    "from_message_id",
    "joined_identity",
    "parse_json",
]
