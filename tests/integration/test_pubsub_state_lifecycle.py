"""Publish-subscribe scoping, versioned state without markers, the purge of expired
markers and the resubmission report — on a real Azurite."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from consumers import orders
from shared.idempotency import DedupKey, Entity, fingerprint
from shared.idempotency.keys import consumer_partition
from shared.idempotency.messages import utcnow
from shared.idempotency.resubmit import check_bodies, check_ids
from shared.idempotency.stores import Marker, State, TableStore
from shared.idempotency.stores._records import GUARD_KIND, MARKER_KIND
from shared.idempotency.testing import entities
from tests.functions import fresh_app, servicebus_message, user_function
from tools.azurite import Azurite

billing, shipping, order_status = (user_function(name) for name in ("billing", "shipping", "order_status"))


@pytest.fixture
def store(azurite: Azurite) -> Iterator[TableStore]:
    with fresh_app(azurite):
        store = orders.queue_consumer().store
        assert isinstance(store, TableStore)
        yield store


def an_order() -> dict[str, Any]:
    return {"orderId": f"o-{uuid.uuid4().hex[:8]}", "customerId": "c-1", "amount": 9.5, "currency": "EUR",
            "items": [{"sku": "a", "quantity": 2}]}  # fmt: skip


# -- several subscribers, one store -----------------------------------------------------


def test_each_subscriber_applies_its_own_effect_once(store: TableStore) -> None:
    order = an_order()
    message = servicebus_message(order, order["orderId"])
    billing(message)  # the first subscriber to finish ...
    shipping(message)  # ... never stops the other
    assert len(entities(store, "invoice")) == 1 and len(entities(store, "picklist")) == 1


def test_duplicates_are_suppressed_per_subscriber(store: TableStore) -> None:
    order = an_order()
    for count in (1, 2, 3):
        billing(servicebus_message(order, order["orderId"], delivery_count=count))
    assert len(entities(store, "invoice")) == 1 and entities(store, "picklist") == []
    shipping(servicebus_message(order, order["orderId"]))  # new for shipping, after three billing deliveries
    assert len(entities(store, "picklist")) == 1
    markers = sorted(item.key.scope for item in store.scan() if item.key is not None)
    assert markers == ["billing", "shipping"]


# -- ordering: versioned, event-carried state ---------------------------------------------


def status_change(order_id: str, status: str, version: int) -> Any:
    return servicebus_message({"orderId": order_id, "status": status, "version": version}, uuid.uuid4().hex)


def stored_status(store: TableStore, order_id: str) -> tuple[str, int]:
    [state] = [
        item.data for item in store.scan(consumer_partition("order-status", order_id)) if item.entity == "status"
    ]
    version = state["StateVersion"]  # Edm.Int64, read back typed
    return state["status"], int(getattr(version, "value", version))


def test_newer_versions_win_and_older_ones_are_stale(store: TableStore, caplog: pytest.LogCaptureFixture) -> None:
    order_id = f"o-{uuid.uuid4().hex[:8]}"
    with caplog.at_level("INFO", logger="idempotency"):
        order_status(status_change(order_id, "paid", 2))
        order_status(status_change(order_id, "placed", 1))  # late, out of order
        order_status(status_change(order_id, "paid", 2))  # redelivered
        order_status(status_change(order_id, "shipped", 3))
    assert stored_status(store, order_id) == ("shipped", 3)
    outcomes = [r.dedup["outcome"] for r in caplog.records if hasattr(r, "dedup")]  # type: ignore[attr-defined]
    assert outcomes == ["processed", "stale", "duplicate", "processed"]
    partition = consumer_partition("order-status", order_id)
    assert [item for item in store.scan(partition) if item.kind is not None] == []  # no marker at all


def test_concurrent_writers_of_different_versions_end_with_the_highest(store: TableStore) -> None:
    order_id = f"o-{uuid.uuid4().hex[:8]}"
    versions = list(range(1, 17))
    barrier = threading.Barrier(len(versions))

    def write(version: int) -> None:
        barrier.wait()
        order_status(status_change(order_id, "packed" if version < 16 else "delivered", version))

    threads = [threading.Thread(target=write, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stored_status(store, order_id) == ("delivered", 16)


# -- lifecycle: purge of expired markers ---------------------------------------------------


def seed(store: TableStore, expired: int, live: int) -> None:
    now = utcnow()
    for i in range(expired + live):
        key = DedupKey("orders", f"seed-{i}")
        expires = now - timedelta(days=1) if i < expired else now + timedelta(days=1)
        store.commit(key, key.id, "fp", [Entity("order", {"orderId": key.id})], None, expires)


def kinds(store: TableStore) -> dict[str, int]:
    found = {"marker": 0, "guard": 0, "business": 0}
    for item in store.scan():
        found["marker" if item.kind == MARKER_KIND else "guard" if item.kind == GUARD_KIND else "business"] += 1
    return found


def test_purge_deletes_exactly_the_expired_markers_and_no_business_entity(store: TableStore) -> None:
    seed(store, expired=30, live=20)
    purge = store.purge_expired(utcnow(), budget=1000)
    assert (purge.scanned, purge.deleted) == (60, 60)  # 30 markers + their 30 guards
    # one page, one transaction per order (marker and guard together), one page of dead letters
    assert purge.requests == 1 + 30 + 1
    assert kinds(store) == {"marker": 20, "guard": 20, "business": 50}
    expired_key = DedupKey("orders", "seed-0")
    assert store.commit(expired_key, expired_key.id, "fp", [Entity("order", {"orderId": "seed-0"})], None,
                        utcnow()).status.value == "duplicate"  # fmt: skip  # the order itself still guards it


def test_purge_respects_its_budget(store: TableStore) -> None:
    seed(store, expired=25, live=5)  # 50 expired records: 25 markers and their guards
    runs = [store.purge_expired(utcnow(), budget=20).deleted for _ in range(4)]
    assert runs == [20, 20, 10, 0]
    assert kinds(store) == {"marker": 5, "guard": 5, "business": 30}


def test_purge_keeps_a_marker_rewritten_since_the_scan(store: TableStore) -> None:
    now = utcnow()
    key = DedupKey("orders", "taken-over")
    old = store.claim(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now - timedelta(seconds=1),
                             lease_until=now - timedelta(seconds=1), owner="a"), now)  # fmt: skip
    stale_view = [e for e in store.table.list_entities() if e["RowKey"].startswith("dedup")]
    store.replace(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now + timedelta(days=1),
                         lease_until=now + timedelta(minutes=5), owner="b"), old.version or "")  # fmt: skip
    assert store._delete_unchanged(store.table, stale_view) == 0  # the ETag read by the scan no longer matches
    assert store.get(key, key.id) is not None


def test_the_timer_function_purges(store: TableStore) -> None:
    seed(store, expired=3, live=2)
    user_function("purge_markers")(None)
    assert kinds(store)["marker"] == 2


# -- the resubmission report -----------------------------------------------------------


def test_the_resubmission_report_tells_what_a_resubmit_would_do(store: TableStore) -> None:
    done, other, fresh = an_order(), an_order(), an_order()
    user_function("orders")(servicebus_message(done, done["orderId"]))
    user_function("orders")(servicebus_message(other, other["orderId"]))
    now = utcnow()
    claimed = DedupKey("orders", "o-claimed")
    consumer = orders.queue_consumer()
    store.claim(Marker(claimed, consumer.partition_of(claimed), State.IN_PROGRESS, "fp", now,
                       now + timedelta(days=1), lease_until=now + timedelta(minutes=5), owner="w"), now)  # fmt: skip

    by_id = check_ids(consumer, [done["orderId"], fresh["orderId"], "o-claimed"])
    assert [line.verdict for line in by_id] == ["completed", "new", "in_progress"]

    unknown_field = json.dumps({**an_order(), "coupon": "X"}).encode()  # valid JSON the schema refuses
    bodies = [json.dumps(done).encode(), json.dumps({**other, "amount": 1.0}).encode(), json.dumps(fresh).encode(),
              b"not json", unknown_field]  # fmt: skip
    by_body = check_bodies(consumer, bodies, "orderId")
    assert [line.verdict for line in by_body] == ["duplicate", "conflict", "new", "invalid", "invalid"]
    assert [line.reason.split(":")[0] for line in by_body[3:]] == ["invalid_json", "schema_violation"]
    assert fingerprint(done)  # the report compares RFC 8785 fingerprints, as the consumer does
