"""The library tests' own consumers: one small function per trigger, on a domain of their own
(items), so that the library's proof stands without the example (consumers/orders.py,
order_events.py, recipes/). Self-contained — it imports the library only —
because the runtime tests deploy it as a module of consumers/ (lab.runtime.build).

An item ``{"id", "amount"}`` (message id = id) records the item and one posting: a duplicate
must add neither. ``ITEMS_PAYMENT_URL`` makes the posting a two-phase step through that
payment API first; ``ITEMS_TOPIC`` publishes each item there (the outbox).
"""

from __future__ import annotations

import hashlib
import os
import typing
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import azure.functions as func

from shared.idempotency import (
    Context,
    Effects,
    Entity,
    IdempotentConsumer,
    IdempotentHttp,
    InvalidMessage,
    LatestState,
    Outgoing,
    from_body_field,
)
from shared.idempotency.consumer import Handler
from shared.idempotency.functions import (
    BODY_AS_BYTES,
    consumer,
    on_blob_import,
    on_cloudevents_http,
    on_eventgrid,
    on_eventhub_batch,
    on_http,
    on_schedule,
    on_servicebus,
    on_servicebus_batch,
    on_storage_queue,
    shared_sender,
    shared_store,
    stored_response,
)
from shared.idempotency.imports import FileImport
from shared.idempotency.keys import DedupKey, consumer_partition
from shared.idempotency.stores import DedupStore

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
NEEDS = {"steps", "outbox"}

ITEM = "item"
ITEM_OF = "item|"  # the item's entity where many items share a partition (item_batch)
POSTING = "posting|"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "amount"],
    "properties": {"id": {"type": "string", "minLength": 1}, "amount": {"type": "number", "minimum": 0}},
}
EVENT_TYPE = "test.item.shipped"
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "type": {"const": EVENT_TYPE},
        "data": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string", "minLength": 1}}},
    },
}
STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "status", "version"],
    "properties": {"id": {"type": "string"}, "status": {"type": "string"}, "version": {"type": "integer"}},
}


def item(item_id: str | None = None, amount: float = 10.0, **extra: Any) -> dict[str, Any]:
    """An item message's body; without ``item_id``, a new item's (a fresh id on every call)."""
    return {"id": f"i-{uuid.uuid4().hex[:12]}" if item_id is None else item_id, "amount": amount, **extra}


def payments() -> IdempotentHttp | None:
    url = os.environ.get("ITEMS_PAYMENT_URL")
    return IdempotentHttp(url) if url else None


def topic() -> str | None:
    return os.environ.get("ITEMS_TOPIC") or None


def item_handler(payments: IdempotentHttp | None = None, *, topic: str | None = None,
                 key_is_id: bool = True, shared: bool = False) -> Handler:  # fmt: skip
    """The item and its posting, committed with the marker; with ``payments`` the posting is
    the payment API's charge (step ``charge``), with ``topic`` the item is published there.
    ``shared``: many items share a partition, so the item's entity is named after it."""

    def handle(body: dict[str, Any], context: Context) -> Effects:
        if key_is_id and body["id"] != context.key.id:
            raise InvalidMessage("key_mismatch", "the message's key is not its id")
        record = {"itemId": body["id"], "amount": float(body["amount"])}
        posting = uuid.uuid4().hex
        if payments is not None:
            charge = {"itemId": body["id"], "amount": record["amount"]}
            posting = str(context.step("charge", lambda key: payments.post("/charges", charge, key))["id"])
        return Effects(
            [Entity(ITEM_OF + body["id"] if shared else ITEM, record), Entity(POSTING + posting, record)],
            {"id": body["id"], "posted": record["amount"]},
            [Outgoing(topic, body, "published", {"type": "ItemRecorded"})] if topic else [],
        )

    return handle


def effects_by_item(store: DedupStore, item_id: str | None = None, consumer: str = "items") -> dict[str, Counter[str]]:
    """What is really stored, per item id — ``{"item": n, "posting": m}``, the ground truth —
    of every consumer, or of one item (in ``consumer``'s partition)."""
    found: dict[str, Counter[str]] = {}
    for stored in store.scan(None if item_id is None else consumer_partition(consumer, item_id)):
        if stored.entity is not None and "itemId" in stored.data:
            kind = (ITEM if stored.entity == ITEM or stored.entity.startswith(ITEM_OF)
                    else "posting" if stored.entity.startswith(POSTING) else stored.entity)  # fmt: skip
            found.setdefault(str(stored.data["itemId"]), Counter())[kind] += 1
    return found


def stored(body: dict[str, Any]) -> dict[str, Any]:
    """A body as a record: its ``id`` as ``itemId`` (Cosmos DB reserves ``id`` for the item's own)."""
    return {"itemId": body["id"], **{name: value for name, value in body.items() if name != "id"}}


def shipped_handler(event: dict[str, Any], context: Context) -> Effects:
    data = event["data"]
    return Effects([Entity("shipment", stored(data))], {"id": data["id"], "shipped": True})


def state_handler(change: dict[str, Any], context: Context) -> LatestState:
    return LatestState(Entity("state", {"itemId": change["id"], "status": change["status"]}), int(change["version"]),
                       {"status": change["status"]})  # fmt: skip


def stream_handler(event: dict[str, Any], context: Context) -> Effects:
    # named after the event: a bucket's events share a partition, where a name is unique
    return Effects([Entity(f"tracking|{context.key.id}", {**stored(event), "eventKey": context.key.id})],
                   {"id": event["id"]})  # fmt: skip


def bucket(key: DedupKey) -> str:
    """Events by a stable hash of their key into 4 partitions: a batch commits in a few transactions."""
    return f"b{int(hashlib.sha256(key.id.encode('utf-8', 'surrogatepass')).hexdigest()[:8], 16) % 4}"


def due(day: datetime, count: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """A job's items for an occurrence: the same ids on every run."""
    return [(f"i-{n}", item(f"i-{n}", 1.0 + n)) for n in range(count)]


def job_handler(body: dict[str, Any], context: Context) -> Effects:
    occurrence = context.key.id.partition("/")[0]
    return Effects([Entity("reminder", {**stored(body), "occurrence": occurrence})], {"reminded": body["id"]})


BY_ID = from_body_field("id")


@consumer
def queue_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("items", shared_store(), item_handler(payments(), topic=topic()), schema=SCHEMA,
                              sender=shared_sender() if topic() else None)  # fmt: skip


@consumer
def api_consumer() -> IdempotentConsumer:
    handler = stored_response(item_handler(payments(), topic=topic()), 201, "/api/items/{id}")
    return IdempotentConsumer("items-api", shared_store(), handler, schema=SCHEMA, key_source=BY_ID,
                              replay_results=True, record_refusals=False, bind_request_keys=True,
                              sender=shared_sender() if topic() else None)  # fmt: skip


@consumer
def events_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-events", shared_store(), shipped_handler, schema=EVENT_SCHEMA)


@consumer
def events_api_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-events", shared_store(), shipped_handler, schema=EVENT_SCHEMA,
                              record_refusals=False)  # fmt: skip


@consumer
def subscriber_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-subscriber", shared_store(), item_handler(key_is_id=False), schema=SCHEMA,
                              key_source=BY_ID)  # fmt: skip


@consumer
def state_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-state", shared_store(), state_handler, schema=STATE_SCHEMA, key_source=BY_ID)


@consumer
def batch_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-batch", shared_store(), item_handler(shared=True), schema=SCHEMA,
                              partition_for=lambda key: key.id[:1])  # fmt: skip


@consumer
def stream_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-stream", shared_store(), stream_handler, schema=SCHEMA, partition_for=bucket)


@consumer
def job_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("item-job", shared_store(), job_handler, schema=SCHEMA)


@consumer
def storage_queue_consumer() -> IdempotentConsumer:
    """A Storage queue's message id is the service's: keyed by the body's id."""
    return IdempotentConsumer("item-queue", shared_store(), item_handler(key_is_id=False), schema=SCHEMA,
                              key_source=BY_ID)  # fmt: skip


def imported_item(body: dict[str, Any], context: Context) -> Effects:
    return Effects([Entity(ITEM, stored(body))])


@consumer
def import_consumer() -> FileImport:
    return FileImport("item-imports", shared_store(), imported_item, key_field="id", schema=SCHEMA)


@bp.function_name("items")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="items", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def items(msg: func.ServiceBusMessage) -> None:
    on_servicebus(queue_consumer, msg)


@bp.function_name("items_api")
@bp.route(route="items", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def items_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_http(api_consumer, req)


@bp.function_name("item_events")
@bp.event_grid_trigger(arg_name="event")
def item_events(event: func.CloudEvent) -> None:
    on_eventgrid(events_consumer, event)


@bp.function_name("item_events_api")
@bp.route(route="item-events", methods=["POST", "OPTIONS"], auth_level=func.AuthLevel.FUNCTION)
def item_events_api(req: func.HttpRequest) -> func.HttpResponse:
    return on_cloudevents_http(events_api_consumer, req)


@bp.function_name("item_subscriber")
@bp.service_bus_topic_trigger(arg_name="msg", topic_name="items", subscription_name="subscriber",
                              connection="ServiceBusConnection", data_type=BODY_AS_BYTES)  # fmt: skip
def item_subscriber(msg: func.ServiceBusMessage) -> None:
    on_servicebus(subscriber_consumer, msg)


@bp.function_name("item_state")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="item-state", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES, is_sessions_enabled=True)  # fmt: skip
def item_state(msg: func.ServiceBusMessage) -> None:
    on_servicebus(state_consumer, msg)


@bp.function_name("item_batch")
@bp.service_bus_queue_trigger(arg_name="messages", queue_name="item-batch", connection="ServiceBusConnection",
                              cardinality="many", data_type=BODY_AS_BYTES)  # fmt: skip
def item_batch(messages: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006 - the worker rejects list[...]
    on_servicebus_batch(batch_consumer, messages)


@bp.function_name("item_stream")
@bp.event_hub_message_trigger(arg_name="events", event_hub_name="items", connection="EventHubConnection",
                              cardinality=func.Cardinality.MANY, data_type=BODY_AS_BYTES)  # fmt: skip
@bp.retry(strategy="fixed_delay", max_retry_count="3", delay_interval="00:00:05")
def item_stream(events: typing.List[func.EventHubEvent], context: func.Context) -> None:  # noqa: UP006
    on_eventhub_batch(stream_consumer, events, context)


@bp.function_name("item_job")
@bp.timer_trigger(arg_name="timer", schedule="0 0 6 * * *", use_monitor=True)
@bp.retry(strategy="fixed_delay", max_retry_count="3", delay_interval="00:01:00")
def item_job(timer: func.TimerRequest, context: func.Context) -> None:
    on_schedule(job_consumer, timedelta(days=1), timedelta(hours=6), due, context)


@bp.function_name("item_queue")
@bp.queue_trigger(arg_name="msg", queue_name="item-queue", connection="ItemQueueConnection")
def item_queue(msg: func.QueueMessage) -> None:
    on_storage_queue(storage_queue_consumer, msg)


@bp.function_name("item_import")
@bp.blob_trigger(arg_name="blob", path="item-imports/{name}", connection="ItemImportsConnection",
                 source=func.BlobSource.EVENT_GRID)  # fmt: skip
def item_import(blob: func.InputStream) -> None:
    on_blob_import(import_consumer, blob)
