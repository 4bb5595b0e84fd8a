"""The store contract, against a real server (Azurite here). Every store must pass it."""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from azure.core.exceptions import HttpResponseError

from shared.idempotency import (
    AlreadyClaimed,
    CommitStatus,
    DeadLetter,
    DedupKey,
    Entity,
    Marker,
    State,
    StoreUnavailable,
    VersionConflict,
)
from shared.idempotency.keys import encode_key
from shared.idempotency.records import utcnow
from shared.idempotency.table_store import TableStore
from tools.azurite import Azurite

HOUR = timedelta(hours=1)


def key(name: str | None = None) -> DedupKey:
    return DedupKey("orders", name or uuid.uuid4().hex)


def in_progress(k: DedupKey, *, lease: timedelta = HOUR, expires: timedelta = HOUR, owner: str = "w1") -> Marker:
    now = utcnow()
    return Marker(k, k.id, State.IN_PROGRESS, "fp", now, now + expires, lease_until=now + lease, owner=owner)


def partition_rows(store: TableStore, partition: str) -> list[str]:
    entities = store.table.query_entities("PartitionKey eq @pk", parameters={"pk": encode_key(partition)})
    return sorted(entity["RowKey"] for entity in entities)


def test_commit_writes_marker_and_effects_together(table_store: TableStore) -> None:
    k = key()
    effects = [Entity("order", {"amount": 5.0, "items": [{"sku": "a"}]}), Entity("charge", {"amount": 5.0})]
    result = table_store.commit(k, k.id, "fp1", effects, {"ok": True}, utcnow() + HOUR)
    assert result.status is CommitStatus.NEW
    marker = table_store.get(k, k.id)
    assert marker is not None and marker.state is State.COMPLETED and marker.result == {"ok": True}
    order = table_store.table.get_entity(encode_key(k.id), "order")
    assert order["items"] == '[{"sku":"a"}]'
    assert len(partition_rows(table_store, k.id)) == 4  # guard, marker, order, charge


def test_same_payload_is_a_duplicate_and_writes_nothing(table_store: TableStore) -> None:
    k = key()
    table_store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
    before = partition_rows(table_store, k.id)
    again = table_store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
    assert again.status is CommitStatus.DUPLICATE
    assert partition_rows(table_store, k.id) == before


def test_different_payload_is_a_mismatch_and_writes_nothing(table_store: TableStore) -> None:
    k = key()
    table_store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
    before = partition_rows(table_store, k.id)
    other = table_store.commit(k, k.id, "fp2", [Entity("order", {"n": 2})], None, utcnow() + HOUR)
    assert other == type(other)(CommitStatus.MISMATCH, "fp1")
    assert partition_rows(table_store, k.id) == before
    assert table_store.table.get_entity(encode_key(k.id), "order")["n"] == 1


def test_a_failing_business_write_leaves_no_marker(table_store: TableStore) -> None:
    k = key()
    # Two effects with the same name: the second insert fails inside the transaction.
    effects = [Entity("order", {"n": 1}), Entity("order", {"n": 2})]
    with pytest.raises(HttpResponseError):
        table_store.commit(k, k.id, "fp1", effects, None, utcnow() + HOUR)
    assert table_store.get(k, k.id) is None
    assert partition_rows(table_store, k.id) == []


def test_an_existing_business_entity_without_marker_counts_as_applied(table_store: TableStore) -> None:
    k = key()
    table_store.table.create_entity({"PartitionKey": encode_key(k.id), "RowKey": "order", "n": 1})
    result = table_store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
    assert result.status is CommitStatus.DUPLICATE
    assert table_store.get(k, k.id) is None


def test_concurrent_commits_have_exactly_one_winner(table_store: TableStore) -> None:
    k = key()
    barrier = threading.Barrier(8)
    statuses: list[CommitStatus] = []

    def deliver() -> None:
        barrier.wait()
        statuses.append(table_store.commit(k, k.id, "fp1", [Entity("order", {})], None, utcnow() + HOUR).status)

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == sorted([CommitStatus.NEW] + [CommitStatus.DUPLICATE] * 7)
    assert len(partition_rows(table_store, k.id)) == 3


def test_claim_then_complete_with_effects(table_store: TableStore) -> None:
    k = key()
    claimed = table_store.claim(in_progress(k), utcnow())
    assert claimed.version
    done = table_store.complete(claimed, {"charge": "ch_1"}, [Entity("order", {"n": 1})])
    stored = table_store.get(k, k.id)
    assert stored is not None and stored.state is State.COMPLETED and stored.result == {"charge": "ch_1"}
    assert stored.version == done.version and stored.lease_until is None
    assert "order" in partition_rows(table_store, k.id)


def test_a_retried_claim_of_the_same_owner_is_its_own(table_store: TableStore) -> None:
    k = key()
    first = table_store.claim(in_progress(k, owner="w1"), utcnow())
    again = table_store.claim(in_progress(k, owner="w1"), utcnow())  # the insert's response was lost
    assert again.owner == "w1" and again.version == first.version


def test_a_live_claim_is_not_taken(table_store: TableStore) -> None:
    k = key()
    table_store.claim(in_progress(k, owner="w1"), utcnow())
    with pytest.raises(AlreadyClaimed) as info:
        table_store.claim(in_progress(k, owner="w2"), utcnow())
    assert isinstance(info.value.existing, Marker) and info.value.existing.owner == "w1"


def test_an_expired_marker_is_reclaimed_and_an_unexpired_one_is_not(table_store: TableStore) -> None:
    expired, live = key(), key()
    table_store.claim(in_progress(expired, expires=-HOUR, owner="old"), utcnow())
    table_store.claim(in_progress(live, lease=-HOUR / 2, expires=HOUR, owner="old"), utcnow())  # lease ran out
    unexpired = key()
    table_store.claim(in_progress(unexpired, owner="old"), utcnow())

    assert table_store.claim(in_progress(expired, owner="new"), utcnow()).owner == "new"
    assert table_store.claim(in_progress(live, owner="new"), utcnow()).owner == "new"
    with pytest.raises(AlreadyClaimed):
        table_store.claim(in_progress(unexpired, owner="new"), utcnow())
    stored = table_store.get(unexpired, unexpired.id)
    assert stored is not None and stored.owner == "old"


def test_a_lapsed_claim_is_not_taken_over_by_another_payload(table_store: TableStore) -> None:
    k = key()
    table_store.claim(in_progress(k, lease=-HOUR / 2, owner="old"), utcnow())
    other = replace(in_progress(k, owner="new"), fingerprint="another-payload")
    with pytest.raises(AlreadyClaimed) as info:
        table_store.claim(other, utcnow())
    assert isinstance(info.value.existing, Marker) and info.value.existing.fingerprint == "fp"


def test_racing_takeovers_of_a_stale_claim_have_one_winner(table_store: TableStore) -> None:
    k = key()
    table_store.claim(in_progress(k, lease=-HOUR / 2, owner="dead"), utcnow())
    barrier = threading.Barrier(8)
    winners: list[str] = []

    def take(owner: str) -> None:
        barrier.wait()
        with contextlib.suppress(AlreadyClaimed):
            winners.append(table_store.claim(in_progress(k, owner=owner), utcnow()).owner or "")

    threads = [threading.Thread(target=take, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    stored = table_store.get(k, k.id)
    assert stored is not None and stored.owner == winners[0]


def test_completion_and_release_with_a_stale_version_are_rejected(table_store: TableStore) -> None:
    k = key()
    first = table_store.claim(in_progress(k, lease=-HOUR / 2, owner="slow"), utcnow())
    second = table_store.claim(in_progress(k, owner="fast"), utcnow())  # took over
    with pytest.raises(VersionConflict):
        table_store.complete(first, {"charged": 2}, [Entity("order", {"by": "slow"})])
    with pytest.raises(VersionConflict):
        table_store.release(first)
    assert "order" not in partition_rows(table_store, k.id)
    table_store.complete(second, {"charged": 1}, [Entity("order", {"by": "fast"})])
    assert table_store.table.get_entity(encode_key(k.id), "order")["by"] == "fast"


def test_release_with_the_current_version_deletes(table_store: TableStore) -> None:
    k = key()
    claimed = table_store.claim(in_progress(k), utcnow())
    table_store.release(claimed)
    assert table_store.get(k, k.id) is None
    assert table_store.claim(in_progress(k, owner="next"), utcnow()).owner == "next"


@pytest.mark.parametrize(
    "name",
    [
        "a/b",
        "a#b",
        "a?b",
        "a\\b",
        "ctl\x00\x01\x1f\x7f",
        "unicodé 🙂",
        "' or PartitionKey ne '",
        "~x",
        "%2F",
        "x" * 2048,
    ],
)
def test_hostile_keys_are_stored_and_found_again(table_store: TableStore, name: str) -> None:
    k = DedupKey("orders", name)
    assert table_store.commit(k, k.id, "fp", [Entity("order", {})], None, utcnow() + HOUR).status is CommitStatus.NEW
    stored = table_store.get(k, k.id)
    assert stored is not None and stored.key == k
    assert (
        table_store.commit(k, k.id, "fp", [Entity("order", {})], None, utcnow() + HOUR).status is CommitStatus.DUPLICATE
    )


def test_distinct_hostile_keys_never_collide(table_store: TableStore) -> None:
    names = ["a/b", "a%2Fb", "a%252Fb", "~a", "%7Ea", "x" * 2048, "x" * 2047 + "y", "a|b", "a%7Cb"]
    for name in names:
        k = DedupKey("orders", name)
        status = table_store.commit(k, "shared-partition", "fp", [], None, utcnow() + HOUR).status
        assert status is CommitStatus.NEW, name


def test_dead_letters_are_recorded_once_with_their_body(table_store: TableStore) -> None:
    body = bytes(range(256)) * 600  # not UTF-8, and larger than one property
    record = DeadLetter("orders", "invalid_json", "bad", body, message_id="m/1", delivery_count=2)
    table_store.dead_letter(record)
    table_store.dead_letter(replace(record, delivery_count=3))  # a redelivery of the same message
    stored = table_store.dead_letters("orders")
    assert len(stored) == 1
    assert stored[0].body == body and stored[0].reason == "invalid_json" and stored[0].delivery_count == 3


def test_an_unreachable_store_is_transient() -> None:
    down = Azurite()  # never started: nothing listens on its port
    store = new_table_store_at(down)
    k = key()
    with pytest.raises(StoreUnavailable):
        store.commit(k, k.id, "fp", [], None, utcnow() + HOUR)
    with pytest.raises(StoreUnavailable):
        store.get(k, k.id)


def new_table_store_at(emulator: Azurite) -> TableStore:
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(emulator.connection_string, retry_total=0)
    return TableStore(service, table="unreachable")
