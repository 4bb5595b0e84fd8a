"""Publish-subscribe scoping, versioned state without markers, the purge of expired
markers and the resubmission report — on a real Azurite."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableServiceClient

from shared.idempotency import Entity
from shared.idempotency.keys import DedupKey, consumer_partition
from shared.idempotency.messages import utcnow
from shared.idempotency.payload import fingerprint
from shared.idempotency.resubmit import check_bodies, check_ids
from shared.idempotency.stores import Marker, State, TableStore, _expiry
from shared.idempotency.stores._expiry import SETTLE
from shared.idempotency.stores._records import GUARD_KIND, MARKER_KIND
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing import (
    expiry_index,
    forget_expiry_notes,
    hold_expiry_notes,
    pending_expiry_notes,
    refused_expiry_rows,
)
from shared.idempotency.testing.azurite import Azurite
from tests.app import ITEM, effects_by_item, queue_consumer
from tests.app import item as item_body
from tests.conftest import new_table_store
from tests.functions import fresh_app, servicebus_message, user_function

items, item_subscriber, item_state = (user_function(name) for name in ("items", "item_subscriber", "item_state"))


# -- several consumers of one message, one store --------------------------------------------
# The test app's queue consumer (items) and topic subscriber (item-subscriber) both take an
# item, keyed by its id: two consumers of the same message, as two subscriptions would be.

ONCE = {"item": 1, "posting": 1}


def test_each_subscriber_applies_its_own_effect_once(items_store: TableStore) -> None:
    body = item_body()
    message = servicebus_message(body, body["id"])
    item_subscriber(message)  # the first consumer to finish ...
    items(message)  # ... never stops the other
    assert effects_by_item(items_store, body["id"], "item-subscriber") == {body["id"]: ONCE}
    assert effects_by_item(items_store, body["id"], "items") == {body["id"]: ONCE}


def test_duplicates_are_suppressed_per_subscriber(items_store: TableStore) -> None:
    body = item_body()
    for count in (1, 2, 3):
        item_subscriber(servicebus_message(body, body["id"], delivery_count=count))
    assert effects_by_item(items_store) == {body["id"]: ONCE}  # the subscriber's, none of the queue consumer's
    assert effects_by_item(items_store, body["id"], "items") == {}
    items(servicebus_message(body, body["id"]))  # new for items, after three deliveries to the subscriber
    assert effects_by_item(items_store, body["id"], "items") == {body["id"]: ONCE}
    markers = sorted(item.key.scope for item in items_store.scan() if item.key is not None)
    assert markers == ["item-subscriber", "items"]


# -- ordering: versioned, event-carried state ---------------------------------------------


def status_change(item_id: str, status: str, version: int) -> Any:
    return servicebus_message({"id": item_id, "status": status, "version": version}, uuid.uuid4().hex)


def stored_status(store: TableStore, item_id: str) -> tuple[str, int]:
    [state] = [item.data for item in store.scan(consumer_partition("item-state", item_id)) if item.entity == "state"]
    version: Any = state["StateVersion"]  # Edm.Int64, read back typed
    return state["status"], int(getattr(version, "value", version))


def test_newer_versions_win_and_older_ones_are_stale(items_store: TableStore, caplog: pytest.LogCaptureFixture) -> None:
    item_id = f"i-{uuid.uuid4().hex[:8]}"
    with caplog.at_level("DEBUG", logger="idempotency"):
        item_state(status_change(item_id, "paid", 2))
        item_state(status_change(item_id, "placed", 1))  # late, out of order
        item_state(status_change(item_id, "paid", 2))  # redelivered
        item_state(status_change(item_id, "shipped", 3))
    assert stored_status(items_store, item_id) == ("shipped", 3)
    outcomes = [fields_of(r)["outcome"] for r in caplog.records if fields_of(r)]
    assert outcomes == ["processed", "stale", "duplicate", "processed"]
    partition = consumer_partition("item-state", item_id)
    assert [item for item in items_store.scan(partition) if item.kind is not None] == []  # no marker at all


def test_the_same_version_with_other_data_is_a_recorded_conflict(
    items_store: TableStore, caplog: pytest.LogCaptureFixture
) -> None:
    """v3 "paid", then v3 "cancelled": the stored state is kept, the second message is a
    conflict with a dead-letter record (and the alert), never a silent duplicate."""
    item_id = f"i-{uuid.uuid4().hex[:8]}"
    cancelled = status_change(item_id, "cancelled", 3)
    with caplog.at_level("DEBUG", logger="idempotency"):
        item_state(status_change(item_id, "paid", 3))
        item_state(cancelled)  # acknowledged: recorded first
        item_state(status_change(item_id, "paid", 3))  # a redelivery of the first: a duplicate
    assert stored_status(items_store, item_id) == ("paid", 3)
    outcomes = [(fields_of(r)["outcome"], fields_of(r).get("reason")) for r in caplog.records if fields_of(r)]
    assert outcomes == [("processed", None), ("conflict", "version_conflict"), ("duplicate", None)]
    [record] = [d for d in items_store.dead_letters("item-state") if d.key_id == item_id]
    assert (record.reason, record.message_id) == ("version_conflict", cancelled.message_id)


def test_concurrent_writers_of_different_versions_end_with_the_highest(items_store: TableStore) -> None:
    item_id = f"i-{uuid.uuid4().hex[:8]}"
    versions = list(range(1, 17))
    barrier = threading.Barrier(len(versions))

    def write(version: int) -> None:
        barrier.wait()
        item_state(status_change(item_id, "packed" if version < 16 else "delivered", version))

    threads = [threading.Thread(target=write, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stored_status(items_store, item_id) == ("delivered", 16)


# -- lifecycle: purge of expired markers ---------------------------------------------------


def seed(store: TableStore, expired: int, live: int, prefix: str = "seed") -> None:
    now = utcnow()
    for i in range(expired + live):
        key = DedupKey("items", f"{prefix}-{i}")
        expires = now - timedelta(days=1) if i < expired else now + timedelta(days=1)
        store.commit(key, key.id, "fp", [Entity(ITEM, {"id": key.id})], None, expires)


def kinds(store: TableStore) -> dict[str, int]:
    found = {"marker": 0, "guard": 0, "business": 0}
    for item in store.scan():
        found["marker" if item.kind == MARKER_KIND else "guard" if item.kind == GUARD_KIND else "business"] += 1
    return found


def unsettled(moment: datetime) -> int:
    """1 within SETTLE after an hour turned: a purge then reads the last hour's page too (a
    flush begun in it may still land there, so the cursor has not passed it)."""
    return int(moment - moment.replace(minute=0, second=0, microsecond=0) < SETTLE)


def test_purge_deletes_exactly_the_expired_markers_and_no_business_entity(items_store: TableStore) -> None:
    seed(items_store, expired=30, live=20)
    purge = items_store.purge_expired(utcnow(), budget=1000)
    assert (purge.scanned, purge.deleted) == (30, 60)  # 30 noted markers, deleted with their 30 guards
    # the notes written (2 rows: expired, live), the cursor, 48 empty hours before the first
    # run's and this hour's page, a transaction per item (marker and guard together), the index
    # row, the cursor; the dead letters' page
    assert purge.requests == 2 + 1 + 49 + 30 + 1 + 1 + 1
    assert kinds(items_store) == {"marker": 20, "guard": 20, "business": 50}
    expired_key = DedupKey("items", "seed-0")
    assert items_store.commit(expired_key, expired_key.id, "fp", [Entity(ITEM, {"id": "seed-0"})], None,
                              utcnow()).status.value == "duplicate"  # fmt: skip  # the item itself still guards it
    at = utcnow()
    again = items_store.purge_expired(at, budget=1000)  # from the cursor: this hour's page, the dead letters'
    assert (again.deleted, again.requests) == (0, 1 + 1 + unsettled(at) + 1)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "sdk"])
def test_index_rows_are_written_on_the_stores_own_path_and_purged_from(azurite: Azurite, lean: bool) -> None:
    """A lean store writes its index rows (~50 KB each) with the lean insert, an SDK store with
    create_entity, to the records table; either way the purge reads them back and deletes what
    they noted."""
    writes: list[tuple[str, str]] = []

    def hook(request: Any) -> None:
        http = request.http_request
        if http.method == "POST" and not urlsplit(http.url).path.endswith(("$batch", "/Tables")):  # an insert
            path = urlsplit(http.url).path.rsplit("/", 1)[1]
            writes.append((path, "lean" if "idempotency-table-batch" in http.headers["User-Agent"] else "SDK"))

    store = new_table_store(azurite, lean=lean, hook=hook)
    expired = utcnow() - timedelta(days=1)  # one hour's notes: one row
    for i in range(3):
        key = DedupKey("items", f"gone-{i}")
        store.commit(key, key.id, "fp", [Entity(ITEM, {"id": key.id})], None, expired)
    purge = store.purge_expired(utcnow(), 1000)
    assert writes == [(store.table.table_name, "lean" if lean else "SDK")]
    assert (purge.scanned, purge.deleted) == (3, 6)  # each marker with its guard


def test_an_index_row_the_service_refuses_keeps_its_notes_for_the_next_flush(items_store: TableStore) -> None:
    """A refusal other than "exists" (a 409 TableBeingDeleted, say) loses no note."""
    index = expiry_index(items_store)
    with refused_expiry_rows(items_store, HttpResponseError(message="TableBeingDeleted")) as refused:
        key = DedupKey("items", "kept")
        items_store.commit(key, key.id, "fp", [Entity(ITEM, {"id": key.id})], None, utcnow() - timedelta(days=1))
        assert (index.flush(), len(refused)) == (0, 1)
    assert index.flush() == 1  # the same note, now written
    assert items_store.purge_expired(utcnow(), 1000).deleted == 2


def test_purge_respects_its_budget_and_resumes(items_store: TableStore) -> None:
    seed(items_store, expired=600, live=5)  # 3 index rows (250, 250, 100 notes); each note a marker and its guard
    runs = [items_store.purge_expired(utcnow(), budget=500).deleted for _ in range(4)]
    assert runs == [500, 500, 200, 0]  # a page of index rows at a time, sized to the budget
    assert kinds(items_store) == {"marker": 5, "guard": 5, "business": 605}


@pytest.mark.parametrize(("budget", "expired"), [(1, 3), (7, 26), (25, 26), (49, 26), (52, 26), (60, 26)])
def test_every_purge_run_deletes_exactly_its_budget_and_forgets_nothing(
    items_store: TableStore, budget: int, expired: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEDUP_PURGE_BUDGET is a limit in records: a marker and its guard are two, an index row
    holds 250 notes (scaled to 25 here: 25 + 1 expired, so half a row, a row but one record,
    all, more). A run that runs out inside a row purges part of it and rewrites it with the
    rest — for an odd budget, a guard now and its marker next run — so every run deletes
    exactly its budget until what expired is gone, and no more."""
    monkeypatch.setattr(_expiry, "NOTES_PER_ROW", 25)
    seed(items_store, expired=expired, live=3)
    records, runs = 2 * expired, list[int]()
    while not runs or runs[-1]:
        runs.append(items_store.purge_expired(utcnow(), budget).deleted)
        left = records - sum(runs)
        assert kinds(items_store) == {"marker": 3 + (left + 1) // 2, "guard": 3 + left // 2, "business": expired + 3}
    assert runs == [budget] * (records // budget) + ([records % budget] if records % budget else []) + [0]


def test_the_timer_deletes_exactly_DEDUP_PURGE_BUDGET_records(azurite: Azurite) -> None:
    """The setting, through the timer function: 7 of the 2 x 260 expired records, then 7 more."""
    with fresh_app(azurite, DEDUP_PURGE_BUDGET="7"):
        store = queue_consumer().store
        assert isinstance(store, TableStore)
        seed(store, expired=260, live=0)
        purge = user_function("purge_markers")
        purge(None)
        assert kinds(store) == {"marker": 260 - 3, "guard": 260 - 4, "business": 260}
        purge(None)
        assert kinds(store) == {"marker": 260 - 7, "guard": 260 - 7, "business": 260}


def test_purge_keeps_a_marker_rewritten_since_it_was_noted(items_store: TableStore) -> None:
    now = utcnow()
    key = DedupKey("items", "taken-over")
    old = items_store.claim(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now - timedelta(seconds=1),
                                   lease_until=now - timedelta(seconds=1), owner="a"), now)  # fmt: skip
    items_store.complete(old, {"ok": True})  # final: noted at this version, already expired
    taken = items_store.get(key, key.id)
    assert taken is not None and taken.version
    items_store.replace(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now + timedelta(days=1),
                               lease_until=now + timedelta(minutes=5), owner="b"), taken.version)  # fmt: skip
    purge = items_store.purge_expired(utcnow(), 100)
    assert (purge.scanned, purge.deleted) == (1, 0)  # the ETag noted no longer matches
    assert items_store.get(key, key.id) is not None


def test_the_full_sweep_finds_what_the_index_missed(items_store: TableStore) -> None:
    seed(items_store, expired=4, live=2)
    forget_expiry_notes(items_store)  # an instance that died before writing its notes
    assert items_store.purge_expired(utcnow(), 1000).deleted == 0
    assert items_store.sweep_expired(utcnow(), 1000).deleted == 8
    assert kinds(items_store) == {"marker": 2, "guard": 2, "business": 6}


def test_the_purge_reads_only_what_fell_due_not_the_table(items_store: TableStore) -> None:
    """The same 20 expired items among 20 or 400 live ones: the same requests."""
    seed(items_store, expired=20, live=20)
    small = items_store.purge_expired(utcnow(), 1000)
    seed(items_store, expired=0, live=380, prefix="more")
    now = utcnow()
    for i in range(20):
        key = DedupKey("items", f"late-{i}")
        items_store.commit(key, key.id, "fp", [Entity(ITEM, {"id": key.id})], None, now - timedelta(days=1))
    at = utcnow()
    large = items_store.purge_expired(at, 1000)
    assert (small.deleted, large.deleted) == (40, 40)
    # no first run's empty hours; the rest alike
    assert large.requests == small.requests - 49 + unsettled(at)


def test_the_timer_function_purges(items_store: TableStore) -> None:
    seed(items_store, expired=3, live=2)
    user_function("purge_markers")(None)
    assert kinds(items_store)["marker"] == 2


# -- the resubmission report -----------------------------------------------------------


def test_the_resubmission_report_tells_what_a_resubmit_would_do(items_store: TableStore) -> None:
    done, other, fresh = item_body(), item_body(), item_body()
    items(servicebus_message(done, done["id"]))
    items(servicebus_message(other, other["id"]))
    now = utcnow()
    claimed = DedupKey("items", "i-claimed")
    consumer = queue_consumer()
    items_store.claim(Marker(claimed, consumer.partition_of(claimed), State.IN_PROGRESS, "fp", now,
                             now + timedelta(days=1), lease_until=now + timedelta(minutes=5), owner="w"),
                      now)  # fmt: skip

    by_id = check_ids(consumer, [done["id"], fresh["id"], "i-claimed"])
    assert [line.verdict for line in by_id] == ["completed", "new", "in_progress"]

    negative = json.dumps({**item_body(), "amount": -1.0}).encode()  # valid JSON the schema refuses
    bodies = [json.dumps(done).encode(), json.dumps({**other, "amount": 1.0}).encode(), json.dumps(fresh).encode(),
              b"not json", negative]  # fmt: skip
    by_body = check_bodies(consumer, bodies, "id")
    assert [line.verdict for line in by_body] == ["duplicate", "conflict", "new", "invalid", "invalid"]
    assert [line.reason.split(":")[0] for line in by_body[3:]] == ["invalid_json", "schema_violation"]
    assert fingerprint(done)  # the report compares RFC 8785 fingerprints, as the consumer does


def test_notes_written_twice_are_purged_once(items_store: TableStore) -> None:
    """A row written again after a lost answer (its notes re-queued): the purge deletes each
    marker once and goes on, instead of refusing the duplicate RowKeys in one transaction."""
    seed(items_store, expired=5, live=0)
    pending = pending_expiry_notes(items_store)
    expiry_index(items_store).flush()
    hold_expiry_notes(items_store, pending)  # the same notes again
    purge = items_store.purge_expired(utcnow(), 1000)
    assert (purge.scanned, purge.deleted) == (10, 10)  # both rows read; the second finds its markers gone
    assert kinds(items_store) == {"marker": 0, "guard": 0, "business": 5}


def test_a_purge_past_its_deadline_stops_and_the_next_run_resumes(items_store: TableStore) -> None:
    seed(items_store, expired=5, live=0)
    assert items_store.purge_expired(utcnow(), 1000, deadline=time.monotonic()).deleted == 0
    assert kinds(items_store)["marker"] == 5
    assert items_store.purge_expired(utcnow(), 1000).deleted == 10


def test_two_tables_sharing_the_library_table_keep_their_indexes_apart(azurite: Azurite) -> None:
    """Two apps (DEDUP_TABLE) with one DEDUP_DEADLETTER_TABLE: each purge follows its own notes,
    each in its own table."""
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    shared_dead = "d" + uuid.uuid4().hex[:12]
    first, second = (TableStore(service, "t" + uuid.uuid4().hex[:12], shared_dead) for _ in range(2))
    for store in (first, second):
        store.create_tables()
        seed(store, expired=3, live=0)
    assert first.purge_expired(utcnow(), 1000).deleted == 6
    assert kinds(second)["marker"] == 3  # not touched by the first app's purge
    assert second.purge_expired(utcnow(), 1000).deleted == 6
