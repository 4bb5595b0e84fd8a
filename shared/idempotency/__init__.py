"""The dedup library's root face, for handler authors: stable keys, atomic markers, explicit
outcomes. Imports nothing from azure.functions, so that any trigger (or a plain script) can
use it; the Functions face is ``.functions``, the stores' is ``.stores``, the contract suite
``.testing``.

- the flow: ``IdempotentConsumer`` processes a ``Delivery`` into a ``Result`` with an
  ``Outcome``; a ``Handler`` gets the payload and a ``Context`` and returns ``Effects`` (the
  ``Entity`` records to commit with the marker, a JSON result, and ``Outgoing`` messages
  that a ``Sender`` sends after the commit, the ``Outbox``) or ``LatestState``;
  ``context.step`` runs an effect outside the transaction (``StepPolicy``), and
  ``IdempotentHttp`` calls a service with the step's Idempotency-Key;
- scheduled jobs: ``run_job`` processes each item of an ``occurrence`` once (``JobRun``);
- keys: ``DedupKey``, ``KeySource`` (``from_message_id``, ``from_body_field``,
  ``from_data_field`` for a CloudEvent's data),
  ``cloudevent_identity``, ``joined_identity``;
- payloads: ``parse_json`` (strict), ``fingerprint`` (RFC 8785);
- configuration: ``DedupConfig`` (from the app settings by default);
- errors, all under ``DedupError``: ``ConfigurationError``, ``InvalidMessage``,
  ``StoreUnavailable``, ``DownstreamUnavailable``, ``DownstreamRejected``,
  ``FingerprintMismatch``, ``InFlight``, ``LeaseLost``.
"""

from .config import DedupConfig, StepPolicy
from .consumer import Handler, IdempotentConsumer
from .downstream import IdempotentHttp
from .errors import (
    ConfigurationError,
    DedupError,
    DownstreamRejected,
    DownstreamUnavailable,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    StoreUnavailable,
)
from .jobs import JobRun, occurrence, run_job
from .keys import (
    DedupKey,
    KeySource,
    cloudevent_identity,
    from_body_field,
    from_data_field,
    from_message_id,
    joined_identity,
)
from .messages import Delivery, Effects, Entity, LatestState, Outcome, Outgoing, Result
from .outbox import Outbox, Sender
from .payload import fingerprint, parse_json
from .steps import Context

__all__ = [
    "ConfigurationError",
    "Context",
    "DedupConfig",
    "DedupError",
    "DedupKey",
    "Delivery",
    "DownstreamRejected",
    "DownstreamUnavailable",
    "Effects",
    "Entity",
    "FingerprintMismatch",
    "Handler",
    "IdempotentConsumer",
    "IdempotentHttp",
    "InFlight",
    "InvalidMessage",
    "JobRun",
    "KeySource",
    "LatestState",
    "LeaseLost",
    "Outbox",
    "Outcome",
    "Outgoing",
    "Result",
    "Sender",
    "StepPolicy",
    "StoreUnavailable",
    "cloudevent_identity",
    "fingerprint",
    "from_body_field",
    "from_data_field",
    "from_message_id",
    "joined_identity",
    "occurrence",
    "parse_json",
    "run_job",
]
