"""An Event Hubs stream: shipment tracking events, in batches — one tracking record per
event, however often a replay from a checkpoint or a producer's retry brings it again. Event
Hubs checkpoints a batch whether or not the function succeeded: the retry policy holds the
checkpoint while a transient failure lasts, and on the last try what still fails is parked
for ``python -m shared.idempotency.replay --consumer shipments`` (docs/triggers.md)."""

from __future__ import annotations

import hashlib
import typing
from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_eventhub_batch, shared_store
from shared.idempotency.keys import DedupKey

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

TRACKING = "tracking"
BUCKETS = 4  # a batch of 100 events commits in about 4 transactions (3 rows each: 75 per bucket)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["shipmentId", "orderId", "status"],
    "properties": {"shipmentId": {"type": "string"}, "orderId": {"type": "string"}, "status": {"type": "string"}},
}


def tracking_handler(event: dict[str, Any], context: Context) -> Effects:
    # Named after the event: events of one bucket share a partition, where a name is unique.
    return Effects([Entity(f"{TRACKING}|{context.key.id}", {**event, "eventKey": context.key.id})],
                   {"status": event["status"]})  # fmt: skip


def bucket(key: DedupKey) -> str:
    """The Table partition of an event's records: one of BUCKETS, by a stable hash of its key,
    so that a batch's events share a few entity-group transactions (as the ledger's postings
    of one account do) instead of one each. More buckets spread a busier stream."""
    return f"b{int(hashlib.sha256(key.id.encode('utf-8', 'surrogatepass')).hexdigest()[:8], 16) % BUCKETS}"


@consumer
def tracking_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("shipments", shared_store(), tracking_handler, schema=SCHEMA, partition_for=bucket)


@bp.function_name("shipment_tracking")
@bp.event_hub_message_trigger(arg_name="events", event_hub_name="%SHIPMENT_HUB%", connection="EventHubConnection",
                              cardinality=func.Cardinality.MANY, data_type=BODY_AS_BYTES)  # fmt: skip
@bp.retry(strategy="exponential_backoff", max_retry_count="5", minimum_interval="00:00:05",
          maximum_interval="00:02:00")  # fmt: skip
def shipment_tracking(events: typing.List[func.EventHubEvent], context: func.Context) -> None:  # noqa: UP006 - see ledger.py
    on_eventhub_batch(tracking_consumer, events, context)
