"""The store contract suite, importable: every store — the shipped ones, and yours — must
pass it against its real server. Subclass ``StoreContract`` in a test module and give it a
``store`` fixture that returns a store on fresh, empty tables or containers:

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self) -> DedupStore:
            return MyStore(...)

        def unreachable_store(self) -> DedupStore:
            return MyStore(endpoint_where_nothing_listens)

Needs pytest (the ``testing`` extra). Tests assert exact outcomes and counts; none sleeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import uuid
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest
from azure.core.exceptions import HttpResponseError

from ..errors import AlreadyClaimed, StoreUnavailable, VersionConflict
from ..keys import DedupKey
from ..messages import Change, Entity, utcnow
from ..stores._base import DedupStore
from ..stores._codec import MAX_DEAD_LETTER_BODY
from ..stores._records import Commit, CommitResult, CommitStatus, DeadLetter, Marker, State, StateStatus

HOUR = timedelta(hours=1)


def key(name: str | None = None) -> DedupKey:
    return DedupKey("orders", name or uuid.uuid4().hex)


def in_progress(k: DedupKey, *, lease: timedelta = HOUR, expires: timedelta = HOUR, owner: str = "w1") -> Marker:
    now = utcnow()
    return Marker(k, k.id, State.IN_PROGRESS, "fp", now, now + expires, lease_until=now + lease, owner=owner)


def partition_rows(store: DedupStore, partition: str) -> list[str]:
    return sorted(item.name for item in store.scan(partition))


def entity(store: DedupStore, partition: str, name: str) -> dict[str, object]:
    [found] = [item.data for item in store.scan(partition) if item.entity == name]
    return found


class StoreContract:
    """Override the hooks below where your store differs; every test takes ``store``."""

    no_atomic_batches = "this store's server has no atomic transactions"

    def atomic_batches(self, store: DedupStore) -> bool:
        """False for a server (a local emulator) whose multi-item transactions are not atomic."""
        return True

    def skip_unless_folding(self, store: DedupStore) -> None:
        """Folded completions need a store that folds them, and transactions that are atomic."""
        if not store.folds_completions:
            pytest.skip(f"{type(store).__name__} completes steps on their own (folds_completions is False)")
        if not self.atomic_batches(store):
            pytest.skip(self.no_atomic_batches)

    def expires_natively(self, store: DedupStore) -> bool:
        """True for a store whose server deletes expired records itself (Cosmos DB's ttl)."""
        return False

    def unreachable_store(self) -> DedupStore:
        """The same store pointed at a server that does not answer."""
        pytest.skip(f"{type(self).__name__} does not provide unreachable_store()")

    def assert_dead_letters_expire(self, store: DedupStore, scope: str) -> None:
        """Written with a 10-minute retention just now: gone once expired."""
        assert store.purge_expired(utcnow() + timedelta(minutes=9), 100).deleted == 0
        assert store.purge_expired(utcnow() + timedelta(minutes=11), 100).deleted >= 1
        assert store.dead_letters(scope) == []

    def test_commit_writes_marker_and_effects_together(self, store: DedupStore) -> None:
        k = key()
        effects = [Entity("order", {"amount": 5.0, "items": [{"sku": "a"}]}), Entity("charge", {"amount": 5.0})]
        result = store.commit(k, k.id, "fp1", effects, {"ok": True}, utcnow() + HOUR)
        assert result.status is CommitStatus.NEW
        marker = store.get(k, k.id)
        assert marker is not None and marker.state is State.COMPLETED and marker.result == {"ok": True}
        order = entity(store, k.id, "order")
        assert order["items"] in ('[{"sku":"a"}]', [{"sku": "a"}])  # Table keeps JSON text, Cosmos the value
        assert len(partition_rows(store, k.id)) == 4  # guard, marker, order, charge

    def test_same_payload_is_a_duplicate_and_writes_nothing(self, store: DedupStore) -> None:
        k = key()
        store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
        before = partition_rows(store, k.id)
        again = store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
        assert again.status is CommitStatus.DUPLICATE
        assert partition_rows(store, k.id) == before

    def test_different_payload_is_a_mismatch_and_writes_nothing(self, store: DedupStore) -> None:
        # one business document: on Cosmos, its own marker (create_item, no batch) — runs on the emulator too
        k = key()
        store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
        before = partition_rows(store, k.id)
        other = store.commit(k, k.id, "fp2", [Entity("order", {"n": 2})], None, utcnow() + HOUR)
        assert other == type(other)(CommitStatus.MISMATCH, "fp1")
        assert partition_rows(store, k.id) == before
        assert entity(store, k.id, "order")["n"] == 1

    def test_a_failing_business_write_leaves_no_marker(self, store: DedupStore) -> None:
        if not self.atomic_batches(store):
            pytest.skip(self.no_atomic_batches)  # a failed batch must leave nothing behind
        k = key()
        # Two effects with the same name: the second insert fails inside the transaction.
        effects = [Entity("order", {"n": 1}), Entity("order", {"n": 2})]
        try:  # the server's refusal (400: refused for good), or the store's own check
            refused = store.commit(k, k.id, "fp1", effects, None, utcnow() + HOUR).status is CommitStatus.REFUSED
        except (HttpResponseError, ValueError) as failed:
            refused = not isinstance(failed, StoreUnavailable)  # never retried as if transient
        assert refused
        assert store.get(k, k.id) is None
        assert partition_rows(store, k.id) == []

    @pytest.mark.parametrize("effects", [1, 2], ids=["one effect", "two effects"])
    def test_a_resent_commit_knows_its_own_earlier_attempt(self, store: DedupStore, effects: int) -> None:
        """A commit applied but answered 500 is resent with ``retry``: the marker carrying the
        same owner is that delivery's own commit (NEW, with the marker as it was committed: the
        resend's own decision may differ); another owner's is a DUPLICATE."""
        k = key()
        entities = [Entity(f"e{i}", {"n": i}) for i in range(effects)]

        def commit(owner: str, retry: bool) -> CommitStatus:
            sent = Commit(k, k.id, "fp1", entities, {"ok": True}, utcnow() + HOUR, owner, retry)
            return store.commit_many([sent])[0].status

        assert commit("a", retry=False) is CommitStatus.NEW
        own = store.commit_many([Commit(k, k.id, "fp1", entities, {"ok": "decided again"}, utcnow() + HOUR, "a",
                                        True)])[0]  # fmt: skip
        assert own.status is CommitStatus.NEW  # its own: the first answer was lost
        assert own.stored is not None and (own.stored.state, own.stored.result) == (State.COMPLETED, {"ok": True})
        assert commit("b", retry=True) is CommitStatus.DUPLICATE
        assert commit("a", retry=False) is CommitStatus.DUPLICATE  # not a retry: no read, a duplicate
        assert len([item for item in store.scan(k.id) if item.entity]) == effects  # written once

    def test_a_marker_keeps_who_sent_its_message(self, store: DedupStore) -> None:
        """An HTTP caller's commit keeps its origin (part of its fingerprint): a tool compares a
        body as the commit compared it."""
        k = key()
        sent = Commit(k, k.id, "fp1", [Entity("e", {"n": 1})], None, utcnow() + HOUR, origin="key:5e1f")
        assert store.commit_many([sent])[0].status is CommitStatus.NEW
        stored = store.get(k, k.id)
        assert stored is not None and stored.origin == "key:5e1f"

    def test_a_declined_commit_is_a_final_marker_holding_its_decline(self, store: DedupStore) -> None:
        k, decline = key(), {"reason": "sold_out", "detail": "3 seats asked, 2 left"}
        declined = Commit(k, k.id, "fp1", [Entity("refusal", {"n": 1})], decline, utcnow() + HOUR, "a",
                          state=State.DECLINED)  # fmt: skip
        assert store.commit_many([declined])[0].status is CommitStatus.NEW
        stored = store.get(k, k.id)
        assert stored is not None and stored.final and (stored.state, stored.result) == (State.DECLINED, decline)
        assert store.commit_many([declined._replace(owner="b")])[0].status is CommitStatus.DUPLICATE
        assert [item.entity for item in store.scan(k.id) if item.entity] == ["refusal"]  # with its records

    def test_data_the_store_cannot_hold_is_refused_for_good_and_nothing_is_written(self, store: DedupStore) -> None:
        k, other = key(), key()  # two messages of one partition: a store may commit them together
        unstorable = [Entity("order", {"tags": {"a", "b"}})]  # a set: no store, nor JSON, holds it
        results = store.commit_many([Commit(k, k.id, "fp1", unstorable, None, utcnow() + HOUR),
                                     Commit(other, k.id, "fp2", [Entity("other", {"n": 1})], None,
                                            utcnow() + HOUR)])  # fmt: skip
        assert results[0].status is CommitStatus.REFUSED and "set" in (results[0].detail or "")
        assert results[1].status is CommitStatus.NEW  # only its own message is refused
        assert store.get(k, k.id) is None and store.get(other, k.id) is not None
        assert [item.entity for item in store.scan(k.id) if item.entity] == ["other"]

    def test_an_existing_business_entity_without_marker_counts_as_applied(self, store: DedupStore) -> None:
        # one business document: on Cosmos, its own marker (create_item, no batch) — runs on the emulator too
        k = key()
        store.write_state(k.id, Entity("order", {"n": 1}), 0, None)  # no marker
        result = store.commit(k, k.id, "fp1", [Entity("order", {"n": 1})], None, utcnow() + HOUR)
        assert result.status is CommitStatus.DUPLICATE
        assert store.get(k, k.id) is None
        assert [item.entity for item in store.scan(k.id)] == ["order"]  # one document, never a second

    def test_concurrent_commits_have_exactly_one_winner(self, store: DedupStore) -> None:
        k = key()
        barrier = threading.Barrier(8)
        statuses: list[CommitStatus] = []

        def deliver() -> None:
            barrier.wait()
            statuses.append(store.commit(k, k.id, "fp1", [Entity("order", {})], None, utcnow() + HOUR).status)

        threads = [threading.Thread(target=deliver) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses) == sorted([CommitStatus.NEW] + [CommitStatus.DUPLICATE] * 7)
        assert [item.entity for item in store.scan(k.id)].count("order") == 1

    def test_claim_then_complete(self, store: DedupStore) -> None:
        k = key()
        claimed = store.claim(in_progress(k), utcnow())
        assert claimed.version and not claimed.resumed  # a first claim: no earlier attempt to reconcile
        done = store.complete(claimed, {"charge": "ch_1"})
        stored = store.get(k, k.id)
        assert stored is not None and stored.state is State.COMPLETED and stored.result == {"charge": "ch_1"}
        assert stored.version == done.version and stored.lease_until is None

    def test_a_step_completion_commits_with_the_message(self, store: DedupStore) -> None:
        self.skip_unless_folding(store)
        k = key()
        claimed = store.claim(in_progress(k.for_step("charge")), utcnow())
        done = claimed.finished({"charge": "ch_1"})
        commit = Commit(k, k.id, "fp", [Entity("order", {"n": 1})], None, utcnow() + HOUR, completions=(done,))
        assert store.commit_many([commit])[0].status is CommitStatus.NEW
        stored = store.get(k.for_step("charge"), k.id)
        assert stored is not None and stored.state is State.COMPLETED and stored.result == {"charge": "ch_1"}
        assert entity(store, k.id, "order")["n"] == 1 and store.get(k, k.id) is not None

    def test_a_step_taken_over_fails_the_commit_that_completes_it(self, store: DedupStore) -> None:
        """The fence: a delivery whose claim was taken over writes nothing, not even the message."""
        self.skip_unless_folding(store)
        k = key()
        mine = store.claim(in_progress(k.for_step("charge"), lease=-HOUR / 2, owner="w1"), utcnow())
        assert store.claim(in_progress(k.for_step("charge"), owner="w2"), utcnow()).owner == "w2"
        done = mine.finished({"charge": "ch_1"})
        commit = Commit(k, k.id, "fp", [Entity("order", {"n": 1})], None, utcnow() + HOUR, completions=(done,))
        assert store.commit_many([commit])[0].status is CommitStatus.LEASE_LOST
        assert len(partition_rows(store, k.id)) == 1  # the step's marker alone
        stored = store.get(k.for_step("charge"), k.id)
        assert stored is not None and stored.owner == "w2" and stored.state is State.IN_PROGRESS

    def test_a_refused_step_is_final(self, store: DedupStore) -> None:
        k = key()
        claimed = store.claim(in_progress(k), utcnow())
        store.complete(claimed, {"status": 402, "detail": "declined"}, State.REFUSED)
        stored = store.get(k, k.id)
        assert stored is not None and stored.state is State.REFUSED and stored.final
        assert not stored.reclaimable(utcnow() + HOUR / 2)  # a refusal is never taken over before it expires
        assert store.stale_claims(utcnow() + HOUR, 10) == []

    def test_a_retried_claim_of_the_same_owner_is_its_own(self, store: DedupStore) -> None:
        k = key()
        first = store.claim(in_progress(k, owner="w1"), utcnow())
        again = store.claim(in_progress(k, owner="w1"), utcnow())  # the insert's response was lost
        assert again.owner == "w1" and again.version == first.version
        assert again.resumed  # or it is this delivery's earlier attempt, which may have made the call
        store.replace(replace(again, lease_until=utcnow()), again.version or "")  # its call failed: lease ended
        taken_back = store.claim(in_progress(k, owner="w1"), utcnow())
        assert taken_back.resumed and taken_back.version != again.version  # with a new lease, fenced
        assert taken_back.lease_until is not None and taken_back.lease_until > utcnow()

    def test_a_live_claim_is_not_taken(self, store: DedupStore) -> None:
        k = key()
        store.claim(in_progress(k, owner="w1"), utcnow())
        with pytest.raises(AlreadyClaimed) as info:
            store.claim(in_progress(k, owner="w2"), utcnow())
        assert isinstance(info.value.existing, Marker) and info.value.existing.owner == "w1"

    def test_an_expired_marker_is_reclaimed_and_an_unexpired_one_is_not(self, store: DedupStore) -> None:
        expired, live = key(), key()
        store.claim(in_progress(expired, expires=-HOUR, owner="old"), utcnow())
        store.claim(in_progress(live, lease=-HOUR / 2, expires=HOUR, owner="old"), utcnow())  # lease ran out
        unexpired = key()
        store.claim(in_progress(unexpired, owner="old"), utcnow())

        for taken in (store.claim(in_progress(expired, owner="new"), utcnow()),
                      store.claim(in_progress(live, owner="new"), utcnow())):  # fmt: skip
            assert taken.owner == "new" and taken.resumed  # the old owner may have made the call
        done = key()
        store.complete(store.claim(in_progress(done, expires=-HOUR, owner="old"), utcnow()), {"charge": "ch_1"})
        assert not store.claim(in_progress(done, owner="new"), utcnow()).resumed  # completed, then expired: anew
        with pytest.raises(AlreadyClaimed):
            store.claim(in_progress(unexpired, owner="new"), utcnow())
        stored = store.get(unexpired, unexpired.id)
        assert stored is not None and stored.owner == "old"

    def test_a_lapsed_claim_is_not_taken_over_by_another_payload(self, store: DedupStore) -> None:
        k = key()
        store.claim(in_progress(k, lease=-HOUR / 2, owner="old"), utcnow())
        other = replace(in_progress(k, owner="new"), fingerprint="another-payload")
        with pytest.raises(AlreadyClaimed) as info:
            store.claim(other, utcnow())
        assert isinstance(info.value.existing, Marker) and info.value.existing.fingerprint == "fp"

    def test_racing_takeovers_of_a_stale_claim_have_one_winner(self, store: DedupStore) -> None:
        k = key()
        store.claim(in_progress(k, lease=-HOUR / 2, owner="dead"), utcnow())
        barrier = threading.Barrier(8)
        winners: list[str] = []

        def take(owner: str) -> None:
            barrier.wait()
            with contextlib.suppress(AlreadyClaimed):
                winners.append(store.claim(in_progress(k, owner=owner), utcnow()).owner or "")

        threads = [threading.Thread(target=take, args=(f"w{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1
        stored = store.get(k, k.id)
        assert stored is not None and stored.owner == winners[0]

    def test_completion_and_replacement_with_a_stale_version_are_rejected(self, store: DedupStore) -> None:
        k = key()
        first = store.claim(in_progress(k, lease=-HOUR / 2, owner="slow"), utcnow())
        second = store.claim(in_progress(k, owner="fast"), utcnow())  # took over
        with pytest.raises(VersionConflict):
            store.complete(first, {"charged": 2})
        with pytest.raises(VersionConflict):
            store.replace(replace(first, lease_until=utcnow()), first.version or "")
        store.complete(second, {"charged": 1})
        stored = store.get(k, k.id)
        assert stored is not None and stored.owner == "fast" and stored.result == {"charged": 1}

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
    def test_hostile_keys_are_stored_and_found_again(self, store: DedupStore, name: str) -> None:
        k = DedupKey("orders", name)
        assert store.commit(k, k.id, "fp", [Entity("order", {})], None, utcnow() + HOUR).status is CommitStatus.NEW
        stored = store.get(k, k.id)
        assert stored is not None and stored.key == k
        assert (
            store.commit(k, k.id, "fp", [Entity("order", {})], None, utcnow() + HOUR).status is CommitStatus.DUPLICATE
        )

    def test_distinct_hostile_keys_never_collide(self, store: DedupStore) -> None:
        names = ["a/b", "a%2Fb", "a%252Fb", "~a", "%7Ea", "x" * 2048, "x" * 2047 + "y", "a|b", "a%7Cb"]
        for name in names:
            k = DedupKey("orders", name)
            status = store.commit(k, "shared-partition", "fp", [], None, utcnow() + HOUR).status
            assert status is CommitStatus.NEW, name

    def test_dead_letters_are_recorded_once_with_their_body(self, store: DedupStore) -> None:
        body = bytes(range(256)) * 600  # not UTF-8, and larger than one property
        record = DeadLetter("orders", "invalid_json", "bad", body, message_id="m/1", delivery_count=2)
        store.dead_letter(record)
        store.dead_letter(replace(record, delivery_count=3))  # a redelivery of the same message
        stored = store.dead_letters("orders")
        assert len(stored) == 1
        assert stored[0].body == body and stored[0].reason == "invalid_json" and stored[0].delivery_count == 3

    @pytest.mark.parametrize("size", [1_000_000, MAX_DEAD_LETTER_BODY], ids=["1,000,000 bytes", "the bound"])
    def test_a_body_up_to_the_bound_is_kept_whole(self, store: DedupStore, size: int) -> None:
        """An Event Hubs event of up to 1 MiB refused or parked: its source will not deliver it
        again, so the record is all there is. Written again (a redelivery): still one record."""
        body = random.Random(size).randbytes(size)
        record = DeadLetter("orders", "invalid_json", "bad", body, message_id="big", delivery_count=1)
        store.dead_letter(record)
        store.dead_letter(replace(record, delivery_count=2))
        [stored] = store.dead_letters("orders")
        assert stored.body == body and not stored.truncated and stored.body_size is None
        assert (stored.message_id, stored.delivery_count, stored.detail) == ("big", 2, "bad")

    def test_a_body_past_the_bound_is_recorded_truncated_with_its_length_and_hash(self, store: DedupStore) -> None:
        """Never StoreUnavailable for a record's size: a store that answers records the message."""
        body = random.Random(2).randbytes(2_000_000)
        digest = hashlib.sha256(body).hexdigest()
        record = DeadLetter("orders", "invalid_json", "not JSON", body, message_id="huge")
        store.dead_letter(record)
        store.dead_letter(record)  # recorded again: the same record
        [stored] = store.dead_letters("orders")
        assert stored.truncated and (stored.body_size, stored.body_sha256) == (2_000_000, digest)
        assert stored.body == body[:MAX_DEAD_LETTER_BODY] and stored.reason == "invalid_json"
        assert stored.detail == (f"body truncated: the first {MAX_DEAD_LETTER_BODY} of 2000000 bytes are kept "
                                 f"(sha256 of the whole {digest}); not JSON")  # fmt: skip

    def test_dead_letter_records_expire_after_their_retention(self, store: DedupStore) -> None:
        """Refused bodies may hold personal data: each record is deleted
        DEDUP_DEAD_LETTER_RETENTION after it was written (by the purge, or natively)."""
        store.dead_letter_retention = timedelta(minutes=10)
        scope = "s" + uuid.uuid4().hex[:8]
        store.dead_letter(DeadLetter(scope, "invalid_json", "not JSON", b"x" * 200_000, message_id="m-1"))
        assert [r.message_id for r in store.dead_letters(scope)] == ["m-1"]
        self.assert_dead_letters_expire(store, scope)

    def test_expired_markers_and_guards_are_purged_and_business_data_kept(self, store: DedupStore) -> None:
        k = key()
        store.commit(k, k.id, "fp", [Entity("order", {"n": 1}), Entity("charge", {})], None, utcnow() + HOUR)
        if self.expires_natively(store):
            assert store.purge_expired(utcnow() + 2 * HOUR, 100).deleted == 0
            return
        assert store.purge_expired(utcnow(), 100).deleted == 0
        assert store.purge_expired(utcnow() + 2 * HOUR, 100).deleted >= 2  # marker and guard
        assert store.get(k, k.id) is None
        assert sorted(str(item.entity) for item in store.scan(k.id)) == ["charge", "order"]

    def test_versioned_state_keeps_the_newest_version(self, store: DedupStore) -> None:
        partition = uuid.uuid4().hex
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2) is StateStatus.APPLIED
        assert store.upsert_if_newer(partition, Entity("status", {"s": "placed"}), 1) is StateStatus.STALE
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2) is StateStatus.SAME
        assert store.upsert_if_newer(partition, Entity("status", {"s": "shipped"}), 3) is StateStatus.APPLIED
        [status] = [item.data for item in store.scan(partition) if item.entity == "status"]
        assert status["s"] == "shipped"

    def test_a_writer_finds_its_own_write_of_a_version_after_a_lost_answer(self, store: DedupStore) -> None:
        """The writer's token is stored with the state: its retry finds its own write (APPLIED,
        reported once as applied); another writer's copy of the same version is the SAME."""
        partition = uuid.uuid4().hex
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2, owner="w1") is StateStatus.APPLIED
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2, owner="w1") is StateStatus.APPLIED
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2, owner="w2") is StateStatus.SAME
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 2) is StateStatus.SAME
        assert store.upsert_if_newer(partition, Entity("status", {"s": "void"}), 2, owner="w1") is StateStatus.CONFLICT
        assert [item.data["s"] for item in store.scan(partition) if item.entity == "status"] == ["paid"]

    def test_an_equal_version_with_other_data_is_a_conflict_and_keeps_the_stored_state(self, store: DedupStore) -> None:
        partition = uuid.uuid4().hex
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 3) is StateStatus.APPLIED
        assert store.upsert_if_newer(partition, Entity("status", {"s": "cancelled"}), 3) is StateStatus.CONFLICT
        assert store.upsert_if_newer(partition, Entity("status", {"s": "paid"}), 3) is StateStatus.SAME
        assert [item.data["s"] for item in store.scan(partition) if item.entity == "status"] == ["paid"]
        assert store.upsert_if_newer(partition, Entity("status", {"s": "shipped"}), 4) is StateStatus.APPLIED

    def test_an_equal_version_with_equal_data_in_another_form_is_the_same(self, store: DedupStore) -> None:
        """Equal data compare equal (RFC 8785): members in another order, 1 and 1.0, 0.10 and 0.1."""
        partition = uuid.uuid4().hex
        first = {"s": "paid", "amount": 1, "rate": 0.1, "lines": [{"sku": "a", "qty": 2.0}], "note": None}
        again = {"note": None, "lines": [{"qty": 2, "sku": "a"}], "rate": float("0.10"), "amount": 1.0, "s": "paid"}
        assert store.upsert_if_newer(partition, Entity("status", first), 7) is StateStatus.APPLIED
        assert store.upsert_if_newer(partition, Entity("status", again), 7) is StateStatus.SAME
        other_sku = {**again, "lines": [{"qty": 2, "sku": "b"}]}
        assert store.upsert_if_newer(partition, Entity("status", other_sku), 7) is StateStatus.CONFLICT
        one_more = {**first, "lines": [{"sku": "a", "qty": 2.0}, {"sku": "a", "qty": 2.0}]}
        assert store.upsert_if_newer(partition, Entity("status", one_more), 7) is StateStatus.CONFLICT

    def test_concurrent_writers_of_one_version_apply_one_payload(self, store: DedupStore) -> None:
        """8 writers of version 5, half "paid" and half "cancelled": one applies, the rest
        are the same as the stored one or a conflict with it, never written over it."""
        partition = uuid.uuid4().hex
        barrier = threading.Barrier(8)
        answers: list[tuple[str, StateStatus]] = []

        def write(status: str) -> None:
            barrier.wait()
            answers.append((status, store.upsert_if_newer(partition, Entity("status", {"s": status}), 5)))

        threads = [threading.Thread(target=write, args=(s,)) for s in ["paid", "cancelled"] * 4]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        [stored] = [item.data["s"] for item in store.scan(partition) if item.entity == "status"]
        other = "cancelled" if stored == "paid" else "paid"
        assert Counter(answers) == {(stored, StateStatus.APPLIED): 1, (stored, StateStatus.SAME): 3,
                                    (other, StateStatus.CONFLICT): 4}  # fmt: skip

    def test_concurrent_versioned_writers_leave_the_highest_version(self, store: DedupStore) -> None:
        partition = uuid.uuid4().hex
        barrier = threading.Barrier(8)

        def write(version: int) -> None:
            barrier.wait()
            store.upsert_if_newer(partition, Entity("status", {"v": version}), version)

        threads = [threading.Thread(target=write, args=(v,)) for v in range(1, 9)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [item.data["v"] for item in store.scan(partition) if item.entity == "status"] == [8]

    def test_stale_claims_lists_only_lapsed_claims(self, store: DedupStore) -> None:
        lapsed, live = key(), key()
        store.claim(in_progress(lapsed, lease=-HOUR / 2), utcnow())
        store.claim(in_progress(live), utcnow())
        found = {m.key for m in store.stale_claims(utcnow(), 1000)}
        assert lapsed in found and live not in found

    def test_markers_are_listed_by_their_deliverys_enqueued_time(self, store: DedupStore) -> None:
        """The audit's facts (``sequenced``): a consumer's markers and those of its own scopes
        (``scope|…``), by enqueued time; never another consumer's, nor one enqueued outside."""
        scope, now = f"audited{uuid.uuid4().hex[:8]}", utcnow().replace(microsecond=0)

        def commit(k: DedupKey, sequence: int, minutes: int) -> None:
            store.commit_many([Commit(k, k.id, "fp", [], None, now + HOUR, sequence=2**60 + sequence,
                                      enqueued_at=now + timedelta(minutes=minutes))])  # fmt: skip

        commit(DedupKey(scope, "a"), 1, 0)
        commit(DedupKey(f"{scope}|seen", "2"), 2, 1)
        commit(DedupKey(scope, "early"), 3, -10)
        commit(DedupKey(scope, "late"), 4, 10)
        commit(DedupKey(scope + "2", "other"), 5, 0)  # another consumer whose name starts alike
        store.commit(DedupKey(scope, "unplaced"), "unplaced", "fp", [], None, now + HOUR)
        try:
            found = store.sequenced(scope, now - timedelta(minutes=5), now + timedelta(minutes=5))
        except NotImplementedError as exc:
            pytest.skip(f"{exc}: the audit (shared.idempotency.audit) needs it")
        assert sorted((m.key.scope, m.key.id, m.sequence) for m in found) == [
            (scope, "a", 2**60 + 1), (f"{scope}|seen", "2", 2**60 + 2)]  # fmt: skip
        assert {m.enqueued_at for m in found} == {now, now + timedelta(minutes=1)}

    def test_an_unreachable_store_is_transient(self) -> None:
        store = self.unreachable_store()
        k = key()
        with pytest.raises(StoreUnavailable):
            store.commit(k, k.id, "fp", [], None, utcnow() + HOUR)
        with pytest.raises(StoreUnavailable):
            store.get(k, k.id)

    # -- the library's own records beside the data (the outbox) --------------------------------

    def test_entities_are_read_by_prefix_in_name_order_and_only_from_their_partition(self, store: DedupStore) -> None:
        k = key()
        outbox = [Entity(f"~outbox|{k.id}|{name}", {"destination": "t", "n": i}) for i, name in enumerate("ba")]
        assert store.commit(k, k.id, "fp", [Entity("order", {"n": 0}), *outbox], None, utcnow() + HOUR).status is (
            CommitStatus.NEW)  # fmt: skip
        other = key()
        store.put_entity(other.id, Entity(f"~outbox|{k.id}|c", {"n": 9}))  # the same name, another partition
        found = store.read_entities(k.id, f"~outbox|{k.id}|", 10)
        assert [(e.name, e.data["n"]) for e in found] == [(f"~outbox|{k.id}|a", 1), (f"~outbox|{k.id}|b", 0)]
        assert [e.name for e in store.read_entities(k.id, f"~outbox|{k.id}|", 1)] == [f"~outbox|{k.id}|a"]
        assert store.read_entities(k.id, "~outbox|nobody|", 10) == []
        assert {e.name for e in store.read_entities(k.id, "", 10)} == {"order", *(e.name for e in outbox)}

    def test_a_library_record_alone_is_never_the_marker(self, store: DedupStore) -> None:
        """A commit whose one effect is the library's own record (an outgoing message): its
        deletion once dispatched must leave the marker in place."""
        k = key()
        row = Entity(f"~outbox|{k.id}|0", {"destination": "t"})
        store.commit(k, k.id, "fp", [row], None, utcnow() + HOUR)
        store.delete_entities(k.id, [row.name])
        assert store.read_entities(k.id, "~", 10) == []
        marker = store.get(k, k.id)
        assert marker is not None and marker.fingerprint == "fp"
        assert store.commit(k, k.id, "fp", [row], None, utcnow() + HOUR).status is CommitStatus.DUPLICATE

    def test_entities_are_put_replaced_and_deleted_once_or_twice(self, store: DedupStore) -> None:
        partition = key().id
        store.put_entity(partition, Entity("~due|1", {"n": 1}))
        store.put_entity(partition, Entity("~due|1", {"n": 2}))
        store.put_entity(partition, Entity("~due|2", {"n": 3}))
        assert [(e.name, e.data["n"]) for e in store.read_entities(partition, "~due|", 10)] == [
            ("~due|1", 2), ("~due|2", 3)]  # fmt: skip
        store.delete_entities(partition, ["~due|1", "~due|missing"])
        store.delete_entities(partition, ["~due|1"])
        assert [e.name for e in store.read_entities(partition, "", 10)] == ["~due|2"]

    # -- changes of stored entities, with the marker (stores that ``commits_changes``) ------

    def skip_unless_changing(self, store: DedupStore, *, committed: bool = True) -> None:
        """Changes need a store that commits them; ``committed``: and transactions that are atomic."""
        if not store.commits_changes:
            pytest.skip(f"{type(store).__name__} does not commit changes of stored entities (commits_changes)")
        if committed and not self.atomic_batches(store):
            pytest.skip(self.no_atomic_batches)

    def changed(self, store: DedupStore, partition: str, fp: str, *changes: Change) -> CommitResult:
        k = key()
        return store.commit_many([Commit(k, partition, fp, [], None, utcnow() + HOUR, changes=changes)])[0]

    def test_what_is_read_comes_with_its_version_and_the_markers_asked_for(self, store: DedupStore) -> None:
        self.skip_unless_changing(store, committed=False)
        k = key()
        store.commit(k, k.id, "fp1", [Entity("total", {"n": 1})], None, utcnow() + HOUR)
        current = store.read_current(k.id, [k, key()], ["total", "missing"])
        assert list(current.markers) == [k] and current.markers[k].fingerprint == "fp1"
        assert current.entities["total"].data == {"n": 1} and current.entities["total"].etag
        assert (current.entities["missing"].data, current.entities["missing"].etag) == (None, None)
        many = [key() for _ in range(30)]  # more rows than one request may read
        assert store.read_current(k.id, many, ["total"]).markers == {}

    def test_a_change_commits_at_the_version_read_and_is_refused_after_another(self, store: DedupStore) -> None:
        self.skip_unless_changing(store)
        partition = key().id
        created = self.changed(store, partition, "a", Change("total", {"n": 1}, None))
        assert created.status is CommitStatus.NEW
        read = store.read_current(partition, [], ["total"]).entities["total"]
        assert self.changed(store, partition, "b", read.replaced({"n": 2})).status is CommitStatus.NEW
        stale = self.changed(store, partition, "c", read.replaced({"n": 3}))  # read before "b" wrote
        again = self.changed(store, partition, "d", Change("total", {"n": 4}, None))  # created meanwhile
        assert (stale.status, again.status) == (CommitStatus.CONTENDED, CommitStatus.CONTENDED)
        current = store.read_current(partition, [], ["total"]).entities["total"]
        assert current.data == {"n": 2}
        assert self.changed(store, partition, "e", current.deleted()).status is CommitStatus.NEW
        assert store.read_current(partition, [], ["total"]).entities["total"].data is None
        assert not [item for item in store.scan(partition) if item.entity == "total"]

    def test_a_refused_change_writes_nothing_of_its_message(self, store: DedupStore) -> None:
        self.skip_unless_changing(store)
        k, partition = key(), key().id
        store.put_entity(partition, Entity("total", {"n": 1}))
        stale = Change("total", {"n": 2}, store.read_current(partition, [], ["total"]).entities["total"].etag)
        store.put_entity(partition, Entity("total", {"n": 5}))  # another writer, after the read
        commit = Commit(k, partition, "fp", [Entity("credit", {"n": 1})], None, utcnow() + HOUR, changes=(stale,))
        assert store.commit_many([commit])[0].status is CommitStatus.CONTENDED
        assert store.get(k, partition) is None and not [i for i in store.scan(partition) if i.entity == "credit"]

    def test_commits_of_one_call_changing_one_entity_follow_each_other(self, store: DedupStore) -> None:
        self.skip_unless_changing(store)
        partition = key().id
        store.put_entity(partition, Entity("total", {"n": 0}))
        etag = store.read_current(partition, [], ["total"]).entities["total"].etag
        commits = [Commit(key(), partition, f"fp{n}", [], None, utcnow() + HOUR,
                          changes=(Change("total", {"n": n}, etag),)) for n in range(1, 61)]  # fmt: skip
        assert [r.status for r in store.commit_many(commits)] == [CommitStatus.NEW] * 60
        assert store.read_current(partition, [], ["total"]).entities["total"].data == {"n": 60}
        broken = [Commit(key(), partition, "x", [], None, utcnow() + HOUR, changes=(Change("total", {"n": n}, etag),))
                  for n in range(2)]  # fmt: skip
        assert [r.status for r in store.commit_many(broken)] == [CommitStatus.CONTENDED] * 2  # etag long gone
