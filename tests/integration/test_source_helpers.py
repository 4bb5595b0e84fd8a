"""The test helpers of every source a user can add (tests/functions.py: ``storage_queue_message``,
``http_request``, ``eventhub_batch`` with ``retry_context``, ``blob_stream``, ``timer_request``)
drive the library tests' own functions (tests/app.py) on a real Azurite, with exact outcomes;
and each gives what the library's adapters read, as azure.functions decodes the host's."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import azure.functions as func
import pytest

from shared.idempotency import Context, DownstreamUnavailable
from shared.idempotency.functions import RetryLater
from shared.idempotency.functions.adapters import eventhub_deliveries, http_delivery, storage_queue_delivery
from shared.idempotency.jobs import occurrence
from shared.idempotency.stores import DedupStore
from shared.idempotency.testing import wrapped_handler
from tests.app import effects_by_item, import_consumer, item, storage_queue_consumer, stream_consumer
from tests.functions import (
    blob_stream,
    eventhub_batch,
    http_request,
    retry_context,
    storage_queue_message,
    timer_request,
    user_function,
)

item_queue, items_api, item_stream, item_import, item_job = (
    user_function(name) for name in ("item_queue", "items_api", "item_stream", "item_import", "item_job")
)


def failing(handler: Callable[[Any, Context], Any]) -> Callable[[Any, Context], Any]:
    def handle(body: Any, context: Context) -> Any:
        raise DownstreamUnavailable("the carrier's API is down")

    return handle


# -- Storage queue --------------------------------------------------------------------------------


def test_a_queue_message_dequeued_again_and_enqueued_again_applies_once(items_store: DedupStore) -> None:
    body = item("i-1", 12.5)
    item_queue(storage_queue_message(body, message_id="m-1"))
    item_queue(storage_queue_message(body, message_id="m-1", dequeue_count=2))  # visible again: dequeued again
    item_queue(storage_queue_message(body))  # the producer's retry: a new message, a new id
    assert effects_by_item(items_store) == {"i-1": Counter({"item": 1, "posting": 1})}
    assert items_store.dead_letters("item-queue") == []


def test_a_queue_message_still_failing_at_its_last_dequeue_is_dead_lettered(items_store: DedupStore) -> None:
    """host.json's maxDequeueCount is 5: dequeues 1 to 4 raise (visible again), the 5th records
    why before raising (the host moves it to the poison queue)."""
    body = item("i-1")
    with wrapped_handler(storage_queue_consumer(), failing):
        for dequeue in range(1, 6):
            with pytest.raises(RetryLater):
                item_queue(storage_queue_message(body, message_id="m-1", dequeue_count=dequeue))
            recorded = [(d.reason, d.message_id, d.delivery_count) for d in items_store.dead_letters("item-queue")]
            assert recorded == ([] if dequeue < 5 else [("downstream_unavailable", "m-1", 5)]), dequeue
    assert effects_by_item(items_store) == {}


# -- HTTP -------------------------------------------------------------------------------------------


def test_a_request_replayed_under_its_idempotency_key_returns_the_stored_response(items_store: DedupStore) -> None:
    body = item("i-1", 12.5)
    first = items_api(http_request(body, idempotency_key="k-1", url="/api/items", headers={"x-functions-key": "a"}))
    again = items_api(http_request(body, idempotency_key="k-1", url="/api/items?code=a"))  # the same caller's key
    other = items_api(http_request(body, idempotency_key="k-1", url="/api/items", headers={"X-Functions-Key": "b"}))
    assert (first.status_code, first.headers["Location"], "Idempotent-Replayed" in first.headers) == (
        201, "/api/items/i-1", False)  # fmt: skip
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (201, "true")
    assert again.get_body() == first.get_body()
    assert other.status_code == 409  # another caller: nobody else's stored response
    assert effects_by_item(items_store) == {"i-1": Counter({"item": 1, "posting": 1})}


def test_a_request_is_refused_as_the_host_passes_it(items_store: DedupStore) -> None:
    unkeyed = items_api(http_request(item("i-1")))
    as_text = items_api(http_request(item("i-1"), idempotency_key="k-1", headers={"content-type": "text/plain"}))
    assert (unkeyed.status_code, as_text.status_code) == (400, 415)
    assert effects_by_item(items_store) == {}


# -- Event Hubs -------------------------------------------------------------------------------------


def tracked(store: DedupStore) -> Counter[str]:
    """How many tracking records each event key has (the stream's ground truth)."""
    return Counter(str(s.data["eventKey"]) for s in store.scan() if str(s.entity).startswith("tracking|"))


def test_an_event_hubs_batch_replayed_applies_each_event_once(items_store: DedupStore) -> None:
    bodies = (item("i-1"), item("i-2"), item("i-3"))
    for _ in range(2):  # the second time: replayed from the last checkpoint (a restart, a rebalance)
        item_stream(eventhub_batch(*bodies, hub="items", partition_id="2", first_sequence_number=10,
                                   message_ids=["e-1", None, None]), retry_context())  # fmt: skip
    # events 11 and 12 again (a checkpoint at 10), then 13: the producer's retry of e-1, a new event
    item_stream(eventhub_batch(bodies[1], bodies[2], bodies[0], hub="items", partition_id="2",
                               first_sequence_number=11, message_ids=[None, None, "e-1"]), retry_context())  # fmt: skip
    assert tracked(items_store) == Counter(
        {"e-1": 1, "items/2/11@2026-01-01T00:00:11.000000Z": 1, "items/2/12@2026-01-01T00:00:12.000000Z": 1}
    )


def test_an_event_still_failing_on_the_last_try_is_parked_and_the_batch_returns(items_store: DedupStore) -> None:
    """item_stream's retry policy: 3 retries. Before the last one the batch raises (the
    checkpoint waits); on it, the event is parked with its reason."""
    batch = eventhub_batch(item("i-1"), hub="items", message_ids=["e-1"])
    with wrapped_handler(stream_consumer(), failing):
        for retry in range(3):
            with pytest.raises(RetryLater):
                item_stream(batch, retry_context(retry, 3))
        assert items_store.dead_letters("item-stream") == []
        item_stream(batch, retry_context(3, 3))
    assert [(d.reason, d.message_id) for d in items_store.dead_letters("item-stream")] == [("parked", "e-1")]
    assert tracked(items_store) == Counter()


# -- blob import ------------------------------------------------------------------------------------

UPLOADED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def stored_items(store: DedupStore) -> int:
    """Item entities really stored by the import (one per record and version applied)."""
    return sum(1 for s in store.scan() if str(s.entity).endswith("|item"))


def test_a_blob_imported_twice_applies_each_record_once(items_store: DedupStore) -> None:
    content = lines(item("i-1", 1.0), item("i-2", 2.0))
    item_import(blob_stream("item-imports/items.jsonl", content, last_modified=UPLOADED))
    item_import(blob_stream("item-imports/items.jsonl", content, last_modified=UPLOADED))  # the event twice
    item_import(blob_stream("item-imports/items.jsonl", content, last_modified=UPLOADED + timedelta(hours=1)))
    assert stored_items(items_store) == 2
    corrected = lines(item("i-1", 1.0), item("i-2", 2.5))
    item_import(blob_stream("item-imports/items.jsonl", corrected, last_modified=UPLOADED + timedelta(hours=2)))
    current = import_consumer().current("item-imports/items.jsonl", "item")
    assert {key: record["amount"] for key, record in current.items()} == {"i-1": 1.0, "i-2": 2.5}
    assert stored_items(items_store) == 3  # only the changed record applied again
    assert items_store.dead_letters("item-imports") == []


# -- timer ------------------------------------------------------------------------------------------


def reminders(store: DedupStore) -> Counter[tuple[str, str]]:
    return Counter((s.data["occurrence"], s.data["itemId"]) for s in store.scan() if s.entity == "reminder")


def test_a_timer_occurrence_run_again_past_due_does_each_item_once(items_store: DedupStore) -> None:
    item_job(timer_request(), retry_context(0, 3))
    item_job(timer_request(past_due=True), retry_context(0, 3))  # a restart runs it again, late
    when = f"{occurrence(datetime.now(UTC), timedelta(days=1), timedelta(hours=6)):%Y-%m-%dT%H:%M:%SZ}"
    assert reminders(items_store) == Counter({(when, f"i-{n}"): 1 for n in range(5)})


# -- what each helper gives, as the library decodes the host's ---------------------------------------


def test_each_helper_gives_what_the_adapters_read() -> None:
    queued = storage_queue_delivery(storage_queue_message(b'{"id": "i-1"}', message_id="m-1", dequeue_count=3))
    assert (queued.body, queued.message_id, queued.delivery_count, queued.max_deliveries) == (
        b'{"id": "i-1"}', "m-1", 3, 5)  # fmt: skip
    with pytest.raises(Exception, match="UTF-8"):  # the host cannot pass it as text
        storage_queue_message(b"\xff")
    request = http_request({"id": "i-1"}, idempotency_key="k-1", url="/api/items?code=a&empty=",
                           headers={"Traceparent": "00-trace"}, route_params={"id": "i-1"})  # fmt: skip
    assert isinstance(request, func.HttpRequest) and request.url == "https://localhost/api/items?code=a&empty="
    assert dict(request.headers) == {"content-type": "application/json", "content-length": "13",
                                     "idempotency-key": "k-1", "traceparent": "00-trace"}  # fmt: skip
    assert (dict(request.params), dict(request.route_params), request.get_json()) == (
        {"code": "a"}, {"id": "i-1"}, {"id": "i-1"})  # fmt: skip
    delivery = http_delivery(request)
    assert not isinstance(delivery, func.HttpResponse) and delivery.traceparent == "00-trace"
    events = eventhub_batch(b"{}", b"{}", hub="h", partition_id="1", first_sequence_number=7,
                            enqueued_time=datetime(2026, 5, 1, 8, 0, 0, 250000))  # fmt: skip
    found: list[Any] = [(e.sequence_number, e.offset, e.enqueued_time) for e in events]  # offsets: ints, decoded
    assert found == [
        (7, 700, datetime(2026, 5, 1, 8, 0, 0, 250000)), (8, 800, datetime(2026, 5, 1, 8, 0, 1, 250000))]  # fmt: skip
    assert [d.message_id for d in eventhub_deliveries(events)] == [
        "h/1/7@2026-05-01T08:00:00.250000Z", "h/1/8@2026-05-01T08:00:01.250000Z"]  # fmt: skip
    blob: Any = blob_stream("item-imports/a.jsonl", b"{}\n", last_modified=datetime(2026, 3, 1, 12, 0, 0, 999))
    assert (blob.name, blob.length, blob.blob_properties["LastModified"], blob.read()) == (
        "item-imports/a.jsonl", 3, "2026-03-01T12:00:00+00:00", b"{}\n")  # fmt: skip
    timer: Any = timer_request(past_due=True)
    assert (timer.past_due, sorted(timer.schedule_status), timer.schedule) == (
        True, ["Last", "LastUpdated", "Next"], {"AdjustForDST": True})  # fmt: skip
