"""Event Grid (CloudEvents) and HTTP triggers on the same dedup flow, driven through
``app.get_functions()`` with real func.CloudEvent / func.HttpRequest objects, on Azurite."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import azure.functions as func
import pytest

from lab.payment_service import PaymentService
from shared.idempotency.functions import RetryLater
from shared.idempotency.functions.adapters import REPLAYED
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import utcnow
from shared.idempotency.payload import fingerprint
from shared.idempotency.stores import DedupStore, Marker, State
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing import entities
from shared.idempotency.testing.azurite import Azurite
from tests.app import EVENT_TYPE, api_consumer, events_consumer, item
from tests.functions import app_settings, fresh_app, servicebus_message, store_down, user_function

item_events = user_function("item_events")
items_api = user_function("items_api")
item_events_api = user_function("item_events_api")


def shipments(store: DedupStore) -> list[dict[str, Any]]:
    return entities(store, "shipment")


def items_in(store: DedupStore) -> list[dict[str, Any]]:
    return entities(store, "item")


def cloud_event(event_id: str, source: str = "/warehouse/eu", data: dict[str, Any] | None = None,
                **extensions: Any) -> func.CloudEvent:  # fmt: skip
    payload = data or {"id": "i-1"}
    return func.CloudEvent(id=event_id, source=source, type=EVENT_TYPE, specversion="1.0", data=payload,
                           subject="items/i-1", **extensions)  # fmt: skip


def test_duplicate_cloudevents_apply_once(items_store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    for _ in range(3):
        item_events(cloud_event(event_id))
    assert len(shipments(items_store)) == 1


def test_the_same_id_from_two_sources_is_two_events(items_store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    item_events(cloud_event(event_id, source="/warehouse/eu"))
    item_events(cloud_event(event_id, source="/warehouse/us"))
    assert len(shipments(items_store)) == 2


def test_a_changed_event_under_the_same_id_is_recorded_and_not_applied(
    items_store: DedupStore, caplog: pytest.LogCaptureFixture
) -> None:
    event_id = uuid.uuid4().hex
    item_events(cloud_event(event_id))
    with caplog.at_level("INFO", logger="idempotency"):
        item_events(cloud_event(event_id, data={"id": "i-9"},
                                traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))  # fmt: skip
    assert [s["itemId"] for s in shipments(items_store)] == ["i-1"]
    [record] = items_store.dead_letters("item-events")
    assert record.reason == "fingerprint_mismatch"
    assert record.correlation_id == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    [alert] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert fields_of(alert)["correlation_id"].startswith("00-4bf92f35")


def test_invalid_events_are_recorded_and_not_retried(items_store: DedupStore) -> None:
    item_events(cloud_event(uuid.uuid4().hex, data={"name": "i-1"}))  # returns: no retry
    item_events(cloud_event("", source=""))
    assert shipments(items_store) == []
    assert sorted(r.reason for r in items_store.dead_letters("item-events")) == ["missing_key", "schema_violation"]


def test_a_transient_failure_makes_event_grid_retry(items_store: DedupStore) -> None:
    with store_down(events_consumer()), pytest.raises(RetryLater):
        item_events(cloud_event(uuid.uuid4().hex))


# -- HTTP with Idempotency-Key ---------------------------------------------------------


def post_item(
    body: dict[str, Any] | bytes, key: str | None, *, function_key: str = "client-a-key"
) -> func.HttpResponse:
    headers = {"Content-Type": "application/json", "x-functions-key": function_key}
    if key is not None:
        headers["Idempotency-Key"] = key
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response: func.HttpResponse = items_api(func.HttpRequest("POST", "/api/items", headers=headers, body=raw))
    return response


def test_missing_key_is_400_problem_json(items_store: DedupStore) -> None:
    response = post_item(item(), None)
    assert response.status_code == 400 and response.mimetype == "application/problem+json"
    assert json.loads(response.get_body())["status"] == 400
    assert items_in(items_store) == []


def test_first_request_is_processed_and_a_repeat_replays_the_stored_response(items_store: DedupStore) -> None:
    payload, key = item(), uuid.uuid4().hex
    first = post_item(payload, key)
    assert first.status_code == 201 and first.headers["Location"] == f"/api/items/{payload['id']}"
    assert "Idempotent-Replayed" not in first.headers
    again = post_item(dict(reversed(list(payload.items()))), key)  # same payload, other serialisation
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_body() == first.get_body() and again.headers["Location"] == first.headers["Location"]
    assert len(items_in(items_store)) == 1


def test_the_same_item_with_another_payload_is_409_under_any_key(items_store: DedupStore) -> None:
    payload = item(amount=20.0)
    post_item(payload, uuid.uuid4().hex)
    for key in (uuid.uuid4().hex, uuid.uuid4().hex):
        response = post_item({**payload, "amount": 99.0}, key)
        assert response.status_code == 409 and response.mimetype == "application/problem+json"
    assert [o["amount"] for o in items_in(items_store)] == [20.0]


def test_a_new_idempotency_key_for_an_existing_item_replays_it(items_store: DedupStore) -> None:
    """A client that makes a new key per retry (a common bug) never charges twice."""
    payload = item()
    first = post_item(payload, uuid.uuid4().hex)
    again = post_item(payload, uuid.uuid4().hex)
    assert (first.status_code, again.status_code, again.headers[REPLAYED]) == (201, 201, "true")
    assert again.get_body() == first.get_body() and len(items_in(items_store)) == 1


def test_sixteen_concurrent_retries_with_new_keys_write_one_item(items_store: DedupStore) -> None:
    payload = item()
    barrier = threading.Barrier(16)
    statuses: list[tuple[int, bool]] = []

    def send() -> None:
        barrier.wait()
        response = post_item(payload, uuid.uuid4().hex)
        statuses.append((response.status_code, REPLAYED in response.headers))

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [(201, False)] + [(201, True)] * 15
    assert len(items_in(items_store)) == 1


def test_the_same_item_from_another_caller_is_409_and_reveals_nothing(items_store: DedupStore) -> None:
    payload = item(amount=10.0)
    assert post_item(payload, uuid.uuid4().hex, function_key="key-of-a").status_code == 201
    other = post_item(payload, uuid.uuid4().hex, function_key="key-of-b")  # same body, another caller
    assert other.status_code == 409 and b"10.0" not in other.get_body() and REPLAYED not in other.headers
    assert len(items_in(items_store)) == 1


def test_an_item_whose_stored_response_expired_gets_a_final_answer(items_store: DedupStore) -> None:
    payload = item()
    post_item(payload, uuid.uuid4().hex)
    items_store.sweep_expired(utcnow() + timedelta(days=400), 1000)  # the marker is gone, the payload stays
    response = post_item(payload, uuid.uuid4().hex)
    assert response.status_code == 409 and "expired" in json.loads(response.get_body())["detail"]
    assert len(items_in(items_store)) == 1


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"Content-Type": "text/plain"}, json.dumps(item()).encode(), 415),
        ({"Idempotency-Key": "k" * 256}, json.dumps(item()).encode(), 400),
        ({}, b'{"id": "i-dup", "id": "i-other"}', 400),  # duplicate member names
        ({}, b'{"a": ' * 40 + b"1" + b"}" * 40, 400),  # nested deeper than 32
        ({}, b" " * (300 * 1024) + json.dumps(item()).encode(), 413),  # whitespace padding
        ({}, b'{"id": "i-big", "amount": 1' + b"0" * (10 * 1024 * 1024) + b"}", 413),
    ],
    ids=["text-plain", "long-key", "duplicate-member", "deep", "padded", "ten-megabyte-number"],
)
def test_bad_input_is_refused_with_a_problem_and_nothing_written(
    items_store: DedupStore, headers: dict[str, str], body: bytes, status: int
) -> None:
    all_headers = {"Content-Type": "application/json", "x-functions-key": "k", "Idempotency-Key": "key-1", **headers}
    response = items_api(func.HttpRequest("POST", "/api/items", headers=all_headers, body=body))
    assert response.status_code == status and response.mimetype == "application/problem+json"
    assert len(response.get_body()) < 2000  # bounded, whatever the input
    assert items_in(items_store) == []


def test_a_downstream_refusal_does_not_reach_the_caller(azurite: Azurite) -> None:
    with PaymentService() as payments, fresh_app(azurite, ITEMS_PAYMENT_URL=payments.url):
        payments.hook = lambda key, phase: "decline" if phase == "before" else None
        response = post_item(item(), uuid.uuid4().hex)
    assert response.status_code == 400 and b"7781" not in response.get_body() and b"issuer" not in response.get_body()


@pytest.mark.parametrize("store_kind", ["table", "cosmos"])
def test_a_cold_instance_with_the_store_down_answers_503_with_retry_after(azurite: Azurite, store_kind: str) -> None:
    unreachable = azurite.connection_string.replace(f":{azurite.port}/", ":9/")  # nothing listens on port 9
    cosmos = {"DEDUP_STORE": "cosmos", "COSMOS_ENDPOINT": "http://127.0.0.1:9/", "COSMOS_KEY": "a2V5"}
    with (
        fresh_app(azurite),
        app_settings(DEDUP_STORAGE_CONNECTION=unreachable, **(cosmos if store_kind == "cosmos" else {})),
    ):
        posted = post_item(item(), uuid.uuid4().hex)
        event = post_event(*structured(uuid.uuid4().hex))
    for response in (posted, event):
        assert response.status_code == 503 and response.headers["Retry-After"]


def test_an_invalid_item_is_400_and_not_recorded(items_store: DedupStore) -> None:
    response = post_item({"id": "x"}, uuid.uuid4().hex)
    assert response.status_code == 400
    assert items_in(items_store) == [] and items_store.dead_letters("items-api") == []


def test_eight_concurrent_identical_requests_apply_once(items_store: DedupStore) -> None:
    payload, key = item(), uuid.uuid4().hex
    barrier = threading.Barrier(8)
    statuses: list[tuple[int, bool]] = []

    def send() -> None:
        barrier.wait()
        response = post_item(payload, key)
        statuses.append((response.status_code, "Idempotent-Replayed" in response.headers))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [(201, False)] + [(201, True)] * 7
    assert len(items_in(items_store)) == 1


def test_a_forged_principal_header_is_ignored_without_easy_auth(items_store: DedupStore) -> None:
    key = uuid.uuid4().hex
    headers = {"Idempotency-Key": key, "x-functions-key": "key-of-c", "x-ms-client-principal-id": "victim"}
    post_item(item(amount=10.0), key, function_key="key-of-victim")
    forged = items_api(func.HttpRequest("POST", "/api/items", headers=headers,
                                         body=json.dumps(item(amount=10.0)).encode()))  # fmt: skip
    assert "Idempotent-Replayed" not in forged.headers


def test_a_request_in_flight_is_409_with_retry_after(azurite: Azurite) -> None:
    with PaymentService() as payments, fresh_app(azurite, ITEMS_PAYMENT_URL=payments.url, DEDUP_IN_FLIGHT_WAIT="PT0S"):
        consumer = api_consumer()
        payload = item()
        caller = "key:" + hashlib.sha256(b"client-a-key").hexdigest()[:32]
        step = DedupKey(consumer.name, payload["id"], "charge")
        now = utcnow()
        consumer.store.claim(Marker(step, consumer.partition_of(DedupKey(consumer.name, payload["id"])),
                                    State.IN_PROGRESS, fingerprint({"origin": caller, "payload": payload}), now,
                                    now + timedelta(days=1), lease_until=now + timedelta(minutes=5), owner="first"),
                             now)  # fmt: skip
        response = post_item(payload, uuid.uuid4().hex)
        assert response.status_code == 409 and response.headers["Retry-After"], response.get_body()
        assert payments.requests == {}


# -- CloudEvents over HTTP ---------------------------------------------------------------


def post_event(headers: dict[str, str], body: bytes) -> func.HttpResponse:
    request = func.HttpRequest("POST", "/api/item-events", headers=headers, body=body)
    response: func.HttpResponse = item_events_api(request)
    return response


def structured(event_id: str) -> tuple[dict[str, str], bytes]:
    event = {"specversion": "1.0", "id": event_id, "source": "/warehouse/eu", "type": EVENT_TYPE,
             "subject": "items/i-1", "data": {"id": "i-1"}}  # fmt: skip
    return {"Content-Type": "application/cloudevents+json", "x-functions-key": "k"}, json.dumps(event).encode()


def binary(event_id: str) -> tuple[dict[str, str], bytes]:
    headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/warehouse/eu", "ce-type": EVENT_TYPE,
               "ce-subject": "items/i-1", "Content-Type": "application/json", "x-functions-key": "k"}  # fmt: skip
    return headers, json.dumps({"id": "i-1"}).encode()


def test_cloudevents_over_http_in_both_modes_share_the_dedup(items_store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    first = post_event(*structured(event_id))
    again = post_event(*binary(event_id))  # the same event from the same caller, in binary mode
    assert (first.status_code, again.status_code, again.headers[REPLAYED]) == (204, 204, "true")
    assert first.get_body() == b"" and len(shipments(items_store)) == 1


def test_an_http_caller_cannot_pre_claim_an_event_grid_event(items_store: DedupStore) -> None:
    """HTTP events are keyed by (caller, source, id): a forged event posted over HTTP is the
    caller's own; the genuine Event Grid delivery of that id is applied, not refused."""
    event_id = uuid.uuid4().hex
    headers, body = structured(event_id)
    assert post_event({**headers, "x-functions-key": "attacker"}, body).status_code == 204
    item_events(cloud_event(event_id, data={"id": "i-genuine"}))
    assert "i-genuine" in [s["itemId"] for s in shipments(items_store)]
    assert items_store.dead_letters("item-events") == []


@pytest.mark.parametrize("missing", ["id", "source", "specversion", "type"])
@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_an_event_without_a_required_attribute_is_400(items_store: DedupStore, missing: str, mode: str) -> None:
    headers, body = structured("e-1") if mode == "structured" else binary("e-1")
    if mode == "structured":
        body = json.dumps({k: v for k, v in json.loads(body).items() if k != missing}).encode()
    else:
        headers = {k: v for k, v in headers.items() if k != f"ce-{missing}"}
    for _ in range(3):  # redeliveries of the same event must not become three events
        response = post_event(headers, body)
        assert response.status_code == 400 and missing in json.loads(response.get_body())["detail"]
    assert shipments(items_store) == []


def test_not_a_cloudevent_is_400(items_store: DedupStore) -> None:
    assert post_event({"Content-Type": "application/json"}, b'{"hello": 1}').status_code == 400
    structured_mode = {"Content-Type": "application/cloudevents+json"}
    for body in (b"[" * 100_000, b'{"id": "a", "id": "b"}', b"\xff"):  # deep, duplicate member, not UTF-8
        assert post_event(structured_mode, body).status_code == 400


def test_the_webhook_validation_handshake(items_store: DedupStore) -> None:
    request = func.HttpRequest("OPTIONS", "/api/item-events",
                               headers={"WebHook-Request-Origin": "eventgrid.azure.net"}, body=b"")  # fmt: skip
    response = item_events_api(request)
    assert response.status_code == 200 and response.headers["WebHook-Allowed-Origin"] == "eventgrid.azure.net"
    assert response.headers["Allow"] == "POST"
    assert item_events_api(func.HttpRequest("OPTIONS", "/api/item-events", headers={}, body=b"")).status_code == 400


def test_consumers_never_share_a_partition(items_store: DedupStore) -> None:
    """The queue consumer and the HTTP consumer each keep their own partitions: an item id
    taken on one path never blocks, nor answers for, the other."""
    payload = item()
    assert post_item(payload, uuid.uuid4().hex).status_code == 201
    user_function("items")(servicebus_message(payload, payload["id"]))  # processed, not blocked
    assert len(items_in(items_store)) == 2
    assert {stored.name for stored in items_store.scan() if stored.entity == "item"} == {"item"}
