"""Event Grid (CloudEvents schema): ``on_eventgrid``. The CloudEvents key, (source, id), is
``cloudevent_delivery``'s, for the HTTP webhook too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import azure.functions as func

from ..facts import CANARY_PREFIX, CANARY_PROPERTY, CANARY_SOURCE, CANARY_TYPE
from ..keys import joined_identity
from ..messages import Delivery
from ._settle import Consumer, acknowledge_or_retry

# How long a delivery waits inside its invocation for a transient failure to clear: Event Grid
# retries later by itself (with backoff; it must be answered within 30 s). Service Bus
# redelivers at once: DEDUP_TRANSIENT_WAIT.
EVENT_GRID_WAIT = timedelta(seconds=5)


def on_eventgrid(consumer: Consumer, event: func.CloudEvent) -> None:
    """Process one Event Grid CloudEvent: returning accepts it, raising makes Event Grid retry."""
    acknowledge_or_retry(consumer().process(eventgrid_delivery(event)))


def eventgrid_delivery(event: func.CloudEvent) -> Delivery:
    attributes = {**(event.extension_attrs or {}), "type": event.type, "subject": event.subject}
    return replace(cloudevent_delivery(event.source, event.id, attributes, event.get_json()), wait=EVENT_GRID_WAIT)


def cloudevent_delivery(
    source: str | None,
    event_id: str | None,
    attributes: Mapping[str, Any],
    data: Any,
) -> Delivery:
    """Key = (source, id), the CloudEvents uniqueness rule; the payload that is validated
    and fingerprinted is the immutable part: type, subject and data. ``traceparent``,
    when present, is the correlation id. A canary (type ``dedup.canary``, source
    ``/dedup/canary``, an id starting ``dedup-canary-``) is told to the consumer as a Service
    Bus canary is: its id, and its topic in the ``dedup-canary`` property."""
    if (attributes.get("type"), source) == (CANARY_TYPE, CANARY_SOURCE) and (event_id or "").startswith(CANARY_PREFIX):
        entity = data.get("entity") if isinstance(data, Mapping) else None  # a canary (canary.py): its topic
        return Delivery(b"{}", message_id=event_id, properties={CANARY_PROPERTY: str(entity or "")})
    envelope = {"type": attributes.get("type"), "subject": attributes.get("subject"), "data": data}
    return Delivery(
        body=json.dumps(envelope, separators=(",", ":"), default=str).encode(),
        message_id=joined_identity(source, event_id) if source and event_id else None,
        correlation_id=attributes.get("traceparent"),
        traceparent=attributes.get("traceparent"),
    )
