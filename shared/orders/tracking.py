"""The stream example: shipment tracking events from Event Hubs, one tracking record per
event, however often a replay from a checkpoint or a producer's retry brings it again."""

from __future__ import annotations

import hashlib
from typing import Any

from shared.idempotency import Context, Effects, Entity
from shared.idempotency.keys import DedupKey

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
