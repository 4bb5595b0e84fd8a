"""An Event Hubs stream: shipment tracking events, in batches. Event Hubs checkpoints a
batch whether or not the function succeeded: the retry policy holds the checkpoint while a
transient failure lasts, and on the last try what still fails is parked for
``python -m shared.idempotency.replay --consumer shipments`` (docs/triggers.md)."""

from __future__ import annotations

import typing

import azure.functions as func

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_eventhub_batch, shared_store
from shared.orders.tracking import SCHEMA, bucket, tracking_handler

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


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
