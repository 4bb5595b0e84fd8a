"""The dedup library's root face: what a handler author writes — stable keys, atomic
markers, explicit outcomes. Imports nothing from azure.functions, so that any trigger (or a
plain script) can use it; the Functions face is ``.functions``, the stores' is ``.stores``,
the contract suite ``.testing``.

- the flow: ``IdempotentConsumer`` processes a ``Delivery`` into a ``Result`` with an
  ``Outcome``; its handler gets the payload and a ``Context`` and returns ``Effects`` (the
  ``Entity`` records to commit with the marker, the changes of what it read with
  ``context.read``, a JSON result, ``Outgoing`` messages sent after the commit, or that it
  ``Declined`` the message: a business "no" recorded with the marker) or ``LatestState``;
  ``context.step`` runs an effect outside the transaction (``StepPolicy``), and
  ``IdempotentHttp`` calls a service with the step's Idempotency-Key;
- keys: a ``KeySource``, ``(message_id, payload) -> key`` (``from_message_id``,
  ``from_body_field``, ``from_data_field`` for a CloudEvent's data);
- configuration: ``DedupConfig`` (from the app settings by default);
- errors, all under ``DedupError``: ``InvalidMessage`` (refused for good),
  ``DownstreamUnavailable`` (retried), ``DownstreamRejected`` (refused by the service).

The rest lives in its module: ``.errors``, ``.keys``, ``.payload``, ``.jobs``, ``.outbox``, ``.consumer``.
"""

from .config import DedupConfig, StepPolicy
from .consumer import IdempotentConsumer
from .downstream import IdempotentHttp
from .errors import DedupError, DownstreamRejected, DownstreamUnavailable, InvalidMessage
from .keys import KeySource, from_body_field, from_data_field, from_message_id
from .messages import Declined, Delivery, Effects, Entity, LatestState, Outcome, Outgoing, Result
from .steps import Context

__all__ = [
    "Context",
    "Declined",
    "DedupConfig",
    "DedupError",
    "Delivery",
    "DownstreamRejected",
    "DownstreamUnavailable",
    "Effects",
    "Entity",
    "IdempotentConsumer",
    "IdempotentHttp",
    "InvalidMessage",
    "KeySource",
    "LatestState",
    "Outcome",
    "Outgoing",
    "Result",
    "StepPolicy",
    "from_body_field",
    "from_data_field",
    "from_message_id",
]
