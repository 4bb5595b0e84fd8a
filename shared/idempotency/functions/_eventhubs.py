"""Event Hubs (batch trigger): ``on_eventhub_batch``. The hub checkpoints the batch whether or
not the function succeeded: what still fails on the last try is parked for replay."""

from __future__ import annotations

from datetime import UTC

import azure.functions as func

from ..keys import joined_identity
from ..messages import Delivery
from ._settle import Consumer, settle_or_park

# Where a producer's own id for an event may be: the AMQP message-id (EventData.message_id,
# among the system properties), an application property, or CloudEvents over AMQP (binary
# mode: source + id, with the "cloudEvents_" prefix the binding prefers or "cloudEvents:").
PRODUCER_IDS = ("message-id", "message_id", "messageId", "MessageId")


CLOUDEVENT_PREFIXES = ("cloudEvents_", "cloudEvents:")


def on_eventhub_batch(consumer: Consumer, events: list[func.EventHubEvent], context: func.Context) -> None:
    """Process a batch (``cardinality="many"``). Event Hubs checkpoints the batch whether or
    not the function succeeded: raising only helps while the function's retry policy has
    retries left (it delays the checkpoint). On the last try, what still fails is parked —
    recorded with its reason for ``python -m shared.idempotency.replay`` — and the batch
    returns: a poison event never stops its partition (an invalid one is dead-lettered).

    Order: the handler sees the batch's events in partition order, but each event commits on
    its own (those that share a store partition together), and one retried after a transient
    failure commits after the events that followed it. A handler that needs order across
    events carries it in the data: ``LatestState`` with the event's version or sequence."""
    built = consumer()
    deliveries = eventhub_deliveries(events)
    failing = [(d, r) for d, r in zip(deliveries, built.process_batch(deliveries), strict=True) if not r.acknowledge]
    settle_or_park(built, failing, context)


def eventhub_deliveries(events: list[func.EventHubEvent]) -> list[Delivery]:
    """A batch's events, in partition order. The key: the producer's id when the event
    carries one (it also catches a producer's retry, a new event with a new sequence
    number), else the event's place in its hub (``event_position``), which catches replays
    from a checkpoint only. The host shares one metadata for the batch (``events[0].metadata``)."""
    metadata = (events[0].metadata or {}) if events else {}
    context = metadata.get("PartitionContext") or {}
    properties = metadata.get("PropertiesArray") or [{} for _ in events]
    system = metadata.get("SystemPropertiesArray") or [{} for _ in events]
    where = f"{context.get('EventHubName', '')}/{context.get('PartitionId', '')}"
    deliveries = []
    for event, props, sys_props in zip(events, properties, system, strict=True):
        props = dict(props or {})
        found = {**props, **dict(sys_props or {})}
        own = next((str(found[name]) for name in PRODUCER_IDS if found.get(name)), None)
        for prefix in CLOUDEVENT_PREFIXES:
            if own is None and props.get(prefix + "id") and props.get(prefix + "source"):
                own = joined_identity(str(props[prefix + "source"]), str(props[prefix + "id"]))
        traceparent = props.get("traceparent") or props.get("Diagnostic-Id")
        deliveries.append(Delivery(event.get_body(), message_id=own or event_position(where, event),
                                   traceparent=str(traceparent) if traceparent else None,
                                   properties=props))  # fmt: skip
    return deliveries


def event_position(where: str, event: func.EventHubEvent) -> str:
    """``<hub>/<partition>/<sequence number>@<enqueued time, UTC>``. Sequence numbers start
    again at 0 when a hub is re-created under the same name (or after a geo-DR failover): the
    enqueued time, which a replay from a checkpoint keeps, tells those events apart."""
    when = event.enqueued_time
    if when is None:  # the host always sends it; a hand-built event may not
        return f"{where}/{event.sequence_number}"
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return f"{where}/{event.sequence_number}@{when.isoformat(timespec='microseconds')}Z"
