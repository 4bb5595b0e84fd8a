"""Event Grid (CloudEvents schema): ``on_eventgrid``. The CloudEvents key, (source, id), is
``cloudevent_delivery``'s, for the HTTP webhook too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import azure.functions as func

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
    when present, is the correlation id."""
    envelope = {"type": attributes.get("type"), "subject": attributes.get("subject"), "data": data}
    return Delivery(
        body=json.dumps(envelope, separators=(",", ":"), default=str).encode(),
        message_id=joined_identity(source, event_id) if source and event_id else None,
        correlation_id=attributes.get("traceparent"),
        traceparent=attributes.get("traceparent"),
    )
