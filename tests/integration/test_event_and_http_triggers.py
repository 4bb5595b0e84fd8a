"""Event Grid (CloudEvents) and HTTP triggers on the same dedup flow, driven through
``app.get_functions()`` with real func.CloudEvent / func.HttpRequest objects, on Azurite."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import azure.functions as func
import pytest

import function_app
from shared.bindings import RetryLater
from shared.idempotency import DedupKey, DedupStore, Marker, State, fingerprint, joined_identity
from shared.idempotency.records import utcnow
from shared.orders import SHIPPED
from tests.functions import fresh_app, store_down, user_function
from tools.azurite import Azurite
from tools.payment_service import PaymentService

order_events = user_function("order_events")
orders_api = user_function("orders_api")
events_api = user_function("events_api")


@pytest.fixture
def store(azurite: Azurite) -> Iterator[DedupStore]:
    with fresh_app(azurite):
        yield function_app.consumers().orders.store


def shipments(store: DedupStore) -> list[dict[str, Any]]:
    return [item.data for item in store.scan() if item.entity == "shipment"]


def orders_in(store: DedupStore) -> list[dict[str, Any]]:
    return [item.data for item in store.scan() if item.entity == "order"]


def cloud_event(event_id: str, source: str = "/warehouse/eu", data: dict[str, Any] | None = None,
                **extensions: Any) -> func.CloudEvent:  # fmt: skip
    payload = data or {"orderId": "o-1", "carrier": "DHL", "trackingNumber": "T-1"}
    return func.CloudEvent(id=event_id, source=source, type=SHIPPED, specversion="1.0", data=payload,
                           subject="orders/o-1", **extensions)  # fmt: skip


def test_duplicate_cloudevents_apply_once(store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    for _ in range(3):
        order_events(cloud_event(event_id))
    assert len(shipments(store)) == 1


def test_the_same_id_from_two_sources_is_two_events(store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    order_events(cloud_event(event_id, source="/warehouse/eu"))
    order_events(cloud_event(event_id, source="/warehouse/us"))
    assert len(shipments(store)) == 2


def test_a_changed_event_under_the_same_id_is_recorded_and_not_applied(
    store: DedupStore, caplog: pytest.LogCaptureFixture
) -> None:
    event_id = uuid.uuid4().hex
    order_events(cloud_event(event_id))
    with caplog.at_level("INFO", logger="idempotency"):
        order_events(cloud_event(event_id, data={"orderId": "o-1", "carrier": "UPS", "trackingNumber": "T-9"},
                                 traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))  # fmt: skip
    assert [s["carrier"] for s in shipments(store)] == ["DHL"]
    [record] = store.dead_letters("order-events")
    assert record.reason == "fingerprint_mismatch"
    assert record.correlation_id == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    [alert] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert alert.dedup["correlation_id"].startswith("00-4bf92f35")  # type: ignore[attr-defined]


def test_invalid_events_are_recorded_and_not_retried(store: DedupStore) -> None:
    order_events(cloud_event(uuid.uuid4().hex, data={"orderId": "o-1"}))  # returns: no retry
    order_events(cloud_event("", source=""))
    assert shipments(store) == []
    assert sorted(r.reason for r in store.dead_letters("order-events")) == ["missing_key", "schema_violation"]


def test_a_transient_failure_makes_event_grid_retry(store: DedupStore) -> None:
    with store_down(function_app.consumers().order_events), pytest.raises(RetryLater):
        order_events(cloud_event(uuid.uuid4().hex))


# -- HTTP with Idempotency-Key ---------------------------------------------------------


def an_order(order_id: str | None = None, amount: float = 20.0) -> dict[str, Any]:
    return {"orderId": order_id or f"o-{uuid.uuid4().hex[:8]}", "customerId": "c-1", "amount": amount,
            "currency": "EUR", "items": [{"sku": "a", "quantity": 1}]}  # fmt: skip


def post_order(
    body: dict[str, Any] | bytes, key: str | None, *, function_key: str = "client-a-key"
) -> func.HttpResponse:
    headers = {"Content-Type": "application/json", "x-functions-key": function_key}
    if key is not None:
        headers["Idempotency-Key"] = key
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response: func.HttpResponse = orders_api(func.HttpRequest("POST", "/api/orders", headers=headers, body=raw))
    return response


def test_missing_key_is_400_problem_json(store: DedupStore) -> None:
    response = post_order(an_order(), None)
    assert response.status_code == 400 and response.mimetype == "application/problem+json"
    assert json.loads(response.get_body())["status"] == 400
    assert orders_in(store) == []


def test_first_request_is_processed_and_a_repeat_replays_the_stored_response(store: DedupStore) -> None:
    order, key = an_order(), uuid.uuid4().hex
    first = post_order(order, key)
    assert first.status_code == 201 and first.headers["Location"] == f"/api/orders/{order['orderId']}"
    assert "Idempotent-Replayed" not in first.headers
    again = post_order(dict(reversed(list(order.items()))), key)  # same payload, other serialisation
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_body() == first.get_body() and again.headers["Location"] == first.headers["Location"]
    assert len(orders_in(store)) == 1


def test_same_key_different_payload_is_422(store: DedupStore) -> None:
    key = uuid.uuid4().hex
    order = an_order()
    post_order(order, key)
    response = post_order({**order, "amount": 99.0}, key)
    assert response.status_code == 422 and response.mimetype == "application/problem+json"
    assert [o["amount"] for o in orders_in(store)] == [20.0]


def test_an_invalid_order_is_400_and_not_recorded(store: DedupStore) -> None:
    response = post_order({"orderId": "x"}, uuid.uuid4().hex)
    assert response.status_code == 400
    assert orders_in(store) == [] and store.dead_letters("orders-api") == []


def test_eight_concurrent_identical_requests_apply_once(store: DedupStore) -> None:
    order, key = an_order(), uuid.uuid4().hex
    barrier = threading.Barrier(8)
    statuses: list[tuple[int, bool]] = []

    def send() -> None:
        barrier.wait()
        response = post_order(order, key)
        statuses.append((response.status_code, "Idempotent-Replayed" in response.headers))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [(201, False)] + [(201, True)] * 7
    assert len(orders_in(store)) == 1


def test_one_client_never_sees_another_clients_response(store: DedupStore) -> None:
    key = uuid.uuid4().hex
    a = post_order(an_order(amount=10.0), key, function_key="key-of-a")
    b = post_order(an_order(amount=30.0), key, function_key="key-of-b")  # same key, another client
    assert (a.status_code, b.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in b.headers and json.loads(b.get_body())["charged"] == 30.0
    assert sorted(o["amount"] for o in orders_in(store)) == [10.0, 30.0]


def test_a_forged_principal_header_is_ignored_without_easy_auth(store: DedupStore) -> None:
    key = uuid.uuid4().hex
    headers = {"Idempotency-Key": key, "x-functions-key": "key-of-c", "x-ms-client-principal-id": "victim"}
    post_order(an_order(amount=10.0), key, function_key="key-of-victim")
    forged = orders_api(func.HttpRequest("POST", "/api/orders", headers=headers,
                                         body=json.dumps(an_order(amount=10.0)).encode()))  # fmt: skip
    assert "Idempotent-Replayed" not in forged.headers


def test_a_request_in_flight_is_409_with_retry_after(azurite: Azurite) -> None:
    with PaymentService() as payments, fresh_app(azurite, PAYMENT_API_URL=payments.url, DEDUP_IN_FLIGHT_WAIT="PT0S"):
        consumer = function_app.consumers().orders_api
        order, key = an_order(), uuid.uuid4().hex
        identity = joined_identity("key:" + hashlib.sha256(b"client-a-key").hexdigest()[:32], key)
        step = DedupKey(consumer.name, identity, "charge")
        now = utcnow()
        consumer.store.claim(Marker(step, identity, State.IN_PROGRESS, fingerprint(order), now, now + timedelta(days=1),
                                    lease_until=now + timedelta(minutes=5), owner="first"), now)  # fmt: skip
        response = post_order(order, key)
        assert response.status_code == 409 and response.headers["Retry-After"], response.get_body()
        assert payments.requests == {}


# -- CloudEvents over HTTP ---------------------------------------------------------------


def post_event(headers: dict[str, str], body: bytes) -> func.HttpResponse:
    response: func.HttpResponse = events_api(func.HttpRequest("POST", "/api/events", headers=headers, body=body))
    return response


def structured(event_id: str) -> tuple[dict[str, str], bytes]:
    data = {"orderId": "o-1", "carrier": "DHL", "trackingNumber": "T-1"}
    event = {"specversion": "1.0", "id": event_id, "source": "/warehouse/eu", "type": SHIPPED,
             "subject": "orders/o-1", "data": data}  # fmt: skip
    return {"Content-Type": "application/cloudevents+json"}, json.dumps(event).encode()


def binary(event_id: str) -> tuple[dict[str, str], bytes]:
    headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/warehouse/eu", "ce-type": SHIPPED,
               "ce-subject": "orders/o-1", "Content-Type": "application/json"}  # fmt: skip
    return headers, json.dumps({"orderId": "o-1", "carrier": "DHL", "trackingNumber": "T-1"}).encode()


def test_cloudevents_over_http_in_both_modes_share_the_dedup(store: DedupStore) -> None:
    event_id = uuid.uuid4().hex
    first = post_event(*structured(event_id))
    again = post_event(*binary(event_id))  # the same event, in binary mode
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    order_events(cloud_event(event_id))  # and through Event Grid: still the same event
    assert len(shipments(store)) == 1


def test_not_a_cloudevent_is_400(store: DedupStore) -> None:
    assert post_event({"Content-Type": "application/json"}, b'{"hello": 1}').status_code == 400


def test_the_webhook_validation_handshake(store: DedupStore) -> None:
    request = func.HttpRequest("OPTIONS", "/api/events", headers={"WebHook-Request-Origin": "eventgrid.azure.net"},
                               body=b"")  # fmt: skip
    response = events_api(request)
    assert response.status_code == 200 and response.headers["WebHook-Allowed-Origin"] == "eventgrid.azure.net"
    assert events_api(func.HttpRequest("OPTIONS", "/api/events", headers={}, body=b"")).status_code == 400
