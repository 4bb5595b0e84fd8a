"""What is particular to the Cosmos DB store, on the local emulator (and, where marked,
only on real Cosmos DB when COSMOS_CONTRACT_ENDPOINT / COSMOS_CONTRACT_KEY are set)."""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from datetime import timedelta

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.cosmos import exceptions

from lab.cosmos_emulator import CosmosEmulator, use_cosmos_emulator
from lab.harness import Report, RunConfig, run
from lab.runtimes import InProcess, Runtime
from shared.idempotency import Entity
from shared.idempotency.errors import StoreRefused, StoreUnavailable
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import CommitStatus, CosmosStore, Marker, State, VersionConflict
from shared.idempotency.stores._azure import store_errors
from shared.idempotency.stores._codec import MARKER_FIELDS, marker_fields
from shared.idempotency.stores._records import MARKER_KIND
from shared.idempotency.testing import reset
from shared.idempotency.testing.azurite import Azurite
from tests.app import EVENT_TYPE, item
from tests.conftest import EMULATED, REAL_COSMOS, new_cosmos_store
from tests.targets import ITEMS, items_consumer

DAY = timedelta(days=1)


@pytest.fixture
def cosmos(request: pytest.FixtureRequest) -> CosmosStore:
    return new_cosmos_store(request)


def items(store: CosmosStore, partition: str) -> list[dict[str, object]]:
    return [item.data for item in store.scan(partition)]


def test_one_document_is_its_own_marker_written_by_one_create(cosmos: CosmosStore) -> None:
    key = DedupKey("orders", f"o-{uuid.uuid4().hex[:8]}")
    order = Entity("order", {"orderId": key.id, "amount": 5.0})
    assert cosmos.commit(key, key.id, "fp1", [order], {"ok": 1}, utcnow() + DAY).status is CommitStatus.NEW
    [document] = items(cosmos, key.id)
    assert document["kind"] == MARKER_KIND and document["entity"] == "order" and document["amount"] == 5.0
    assert document["ttl"] == -1  # the business record never expires with the marker
    assert cosmos.commit(key, key.id, "fp1", [order], None, utcnow() + DAY).status is CommitStatus.DUPLICATE
    mismatch = cosmos.commit(key, key.id, "fp2", [order], None, utcnow() + DAY)
    assert (mismatch.status, mismatch.stored_fingerprint) == (CommitStatus.MISMATCH, "fp1")
    assert len(items(cosmos, key.id)) == 1


def test_markers_and_guards_carry_the_retention_as_ttl_and_documents_never_expire(cosmos: CosmosStore) -> None:
    key = DedupKey("orders", f"o-{uuid.uuid4().hex[:8]}")
    effects = [Entity("order", {"orderId": key.id}), Entity("charge|1", {"orderId": key.id})]
    cosmos.commit(key, key.id, "fp", effects, None, utcnow() + timedelta(days=30))
    ttls = {str(item["id"]).split("|")[0] + ("-guard" if item.get("kind") == "dedup-guard" else ""): item["ttl"]
            for item in items(cosmos, key.id)}  # fmt: skip
    assert ttls["order"] == -1 and ttls["charge%7C1"] == -1
    assert 30 * 86400 - 60 <= int(str(ttls["dedup"])) <= 30 * 86400
    assert 30 * 86400 - 60 <= int(str(ttls["dedup-guard"])) <= 30 * 86400


def test_documents_may_not_set_store_fields(cosmos: CosmosStore) -> None:
    key = DedupKey("orders", "o-x")
    with pytest.raises(ValueError):
        cosmos.commit(key, key.id, "fp", [Entity("order", {"partitionKey": "another"})], None, utcnow() + DAY)
    with pytest.raises(ValueError):
        cosmos.commit(key, key.id, "fp", [Entity("order", {"ttl": 5})], None, utcnow() + DAY)


@pytest.mark.parametrize("field", sorted(MARKER_FIELDS))
def test_a_one_document_commit_refuses_every_marker_field(cosmos: CosmosStore, field: str) -> None:
    """Optional marker fields too (step, result, owner…): a document carrying a foreign
    ``step`` would no longer be recognised as this key's marker, and a mismatch would pass
    as a duplicate."""
    key = DedupKey("orders", f"o-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ValueError, match=field):
        cosmos.commit(key, key.id, "fp", [Entity("order", {field: "x"})], None, utcnow() + DAY)
    assert items(cosmos, key.id) == []


def test_the_reserved_names_are_every_field_a_marker_can_carry() -> None:
    now = utcnow()
    full = Marker(DedupKey("s", "k", "step"), "p", State.IN_PROGRESS, "fp", now, now, lease_until=now,
                  owner="w", result={"r": 1}, sequence=7, enqueued_at=now, origin="o")  # fmt: skip
    assert marker_fields(full).keys() == MARKER_FIELDS


@pytest.mark.parametrize("status", [408, 429, 449, 500, 503])
def test_throttling_and_server_errors_are_transient(status: int) -> None:
    with pytest.raises(StoreUnavailable), store_errors():
        raise exceptions.CosmosHttpResponseError(status_code=status, message="injected")  # type: ignore[no-untyped-call]


def test_transport_errors_are_transient_and_client_errors_are_not() -> None:
    with pytest.raises(StoreUnavailable), store_errors():
        raise ServiceRequestError("connection refused")
    with pytest.raises(StoreRefused), store_errors():  # too large: refused for good, dead-lettered
        raise exceptions.CosmosHttpResponseError(status_code=413, message="too large")  # type: ignore[no-untyped-call]
    with pytest.raises(StoreUnavailable), store_errors():  # a 400 not about the data: waited for, logged
        raise exceptions.CosmosHttpResponseError(status_code=400, message="bad request")  # type: ignore[no-untyped-call]
    with pytest.raises(exceptions.CosmosHttpResponseError), store_errors():  # the callers read a 409
        raise exceptions.CosmosHttpResponseError(status_code=409, message="conflict")  # type: ignore[no-untyped-call]


def test_a_stale_replace_is_a_version_conflict(cosmos: CosmosStore) -> None:
    from shared.idempotency.testing import in_progress

    key = DedupKey("orders", f"o-{uuid.uuid4().hex[:8]}")
    first = cosmos.claim(in_progress(key, owner="a"), utcnow())
    cosmos.replace(in_progress(key, owner="b"), first.version or "")
    with pytest.raises(VersionConflict):
        cosmos.replace(in_progress(key, owner="c"), first.version or "")


@pytest.mark.skipif(not all(REAL_COSMOS), reason="TTL is enforced only by Cosmos DB: set COSMOS_CONTRACT_ENDPOINT/KEY")
def test_cosmos_deletes_expired_markers_by_itself(cosmos: CosmosStore) -> None:
    assert id(cosmos) not in EMULATED
    key = DedupKey("orders", f"o-{uuid.uuid4().hex[:8]}")
    effects = [Entity("order", {"orderId": key.id}), Entity("charge|1", {"orderId": key.id})]
    cosmos.commit(key, key.id, "fp", effects, None, utcnow() + timedelta(seconds=2))
    deadline = time.monotonic() + 120
    while cosmos.get(key, key.id) is not None:
        assert time.monotonic() < deadline, "the marker outlived its ttl by two minutes"
        time.sleep(1)
    assert sorted(str(item["entity"]) for item in items(cosmos, key.id)) == ["charge|1", "order"]


def drive(runtime: Runtime, events: int, items: int, seed: int = 7) -> tuple[int, int]:
    """Event Grid, CloudEvents over HTTP and POST /api/items with an Idempotency-Key, each
    retried 1 to 3 times (and a changed body now and then: 422); what the store holds of
    them: (shipments, items)."""
    rng = random.Random(seed)
    for i in range(events):
        data = {"id": f"s-{seed}-{i}"}
        for _ in range(rng.randint(1, 3)):  # retries on the same channel
            if i % 2:  # a publisher posts its own events; Event Grid delivers the others
                headers = {"ce-specversion": "1.0", "ce-id": f"ev-{seed}-{i}", "ce-source": "/warehouse/eu",
                           "ce-type": EVENT_TYPE, "Content-Type": "application/json",
                           "x-functions-key": "k"}  # fmt: skip
                runtime.http("item_events_api", "/api/item-events", headers, json.dumps(data).encode())
            else:
                runtime.cloudevent("item_events", {"id": f"ev-{seed}-{i}", "source": "/warehouse/eu",
                                                   "type": EVENT_TYPE, "specversion": "1.0", "data": data})  # fmt: skip
    for i in range(items):
        body = item(f"web-{seed}-{i}", 10.0 + i)
        for sent in [body] * rng.randint(1, 3) + ([{**body, "amount": 1.0}] if i % 10 == 0 else []):
            headers = {
                "Idempotency-Key": f"idem-{seed}-{i}",
                "x-functions-key": "k",
                "Content-Type": "application/json",
            }
            runtime.http("items_api", "/api/items", headers, json.dumps(sent).encode())
    stored = list(items_consumer(os.environ["DEDUP_STORAGE_CONNECTION"], os.environ["DEDUP_TABLE"]).store.scan())
    shipments = sum(s.entity == "shipment" and str(s.data.get("itemId", "")).startswith(f"s-{seed}-") for s in stored)
    written = sum(s.entity == "item" and str(s.data.get("itemId", "")).startswith(f"web-{seed}-") for s in stored)
    return shipments, written


def test_every_trigger_runs_unchanged_on_cosmos(azurite: Azurite, cosmos_emulator: CosmosEmulator) -> None:
    saved = dict(os.environ)
    try:
        use_cosmos_emulator(cosmos_emulator, "fnitems")
        report = run(RunConfig(messages=200, workers=4, dup_rate=0.5, seed=9, table="fnitems"), azurite, ITEMS)
        shipments, written = drive(InProcess(), events=30, items=30)  # Event Grid, CloudEvents, HTTP
    finally:
        os.environ.clear()
        os.environ.update(saved)
        reset()
    assert isinstance(report, Report) and report.violations == []
    assert (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.outcomes["duplicate"] > 0 and report.effects_applied == report.messages - report.dead_lettered
    assert (shipments, written) == (30, 30)


def test_two_phase_steps_complete_on_the_cosmos_emulator(azurite: Azurite, cosmos_emulator: CosmosEmulator) -> None:
    """A step's completion is one ETag-conditional replace of one item (no batch), so the
    payments path works on the local emulator: one charge and one item per message."""
    saved = dict(os.environ)
    try:
        use_cosmos_emulator(cosmos_emulator, "payitems")
        config = RunConfig(messages=60, workers=4, dup_rate=0.5, seed=11, table="payitems", payments=True)
        report = run(config, azurite, ITEMS)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        reset()
    assert report.violations == [] and (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.payment_charges == report.effects_applied == report.messages - report.dead_lettered
    assert report.outcomes["transient"] == 0  # no delivery had to be abandoned
