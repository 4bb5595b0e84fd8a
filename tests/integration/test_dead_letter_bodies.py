"""Dead-letter records of bodies up to 1 MiB on Table Storage (Azurite): a body past one
entity's room is written as the record's entity and its parts in one entity-group
transaction, read back whole and in order, purged whole, and never half-written; and an
Event Hubs event near the service's 1 MB limit is recorded at its first delivery instead of
retried until its checkpoint moves past it."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest
from azure.data.tables import TableClient
from azure.functions import meta

from shared.idempotency.errors import DedupError
from shared.idempotency.functions import on_eventhub_batch
from shared.idempotency.keys import encode_key
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import DeadLetter, TableStore
from shared.idempotency.testing import dead_letter_entities_edited, dead_letter_table
from shared.idempotency.testing.azurite import Azurite
from tests.app import item, stream_consumer
from tests.conftest import new_table_store
from tests.functions import fresh_app


def rows(store: TableStore, scope: str) -> list[Any]:
    """The dead-letter table's entities of one scope, records and parts."""
    dead: TableClient = dead_letter_table(store)
    return list(dead.query_entities("PartitionKey eq @pk", parameters={"pk": encode_key(scope)}))


def test_a_body_past_one_entity_is_written_as_a_record_and_its_parts_and_purged_whole(azurite: Azurite) -> None:
    store = new_table_store(azurite)
    store.dead_letter_retention = timedelta(minutes=10)
    body = random.Random(1).randbytes(1_000_000)
    store.dead_letter(DeadLetter("shipments", "invalid_json", "not JSON", body, message_id="e-1"))
    entities = rows(store, "shipments")
    assert sorted((e["RowKey"].partition("|")[2], e.get("BodyChunks")) for e in entities) == [("", 10), ("1", 6)]
    [record] = store.dead_letters("shipments")
    assert record.body == body
    assert store.purge_expired(utcnow() + timedelta(minutes=11), 100).deleted == 2
    assert rows(store, "shipments") == [] and store.dead_letters("shipments") == []


def test_a_record_whose_transaction_fails_is_not_written_at_all(azurite: Azurite) -> None:
    """The part after the record's entity is invalid (a property past 64 KiB): the service
    refuses the transaction, and neither the record's entity nor any part is stored."""
    store = new_table_store(azurite)

    def last_invalid(entities: list[dict[str, Any]]) -> None:
        entities[-1]["Body0"] = b"x" * 70_000

    with dead_letter_entities_edited(store, last_invalid):
        with pytest.raises(DedupError):
            store.dead_letter(DeadLetter("shipments", "invalid_json", "", b"y" * 1_000_000, message_id="e-1"))
        assert rows(store, "shipments") == [] and store.dead_letters("shipments") == []


def test_a_record_half_purged_is_not_read_as_a_shorter_body(azurite: Azurite) -> None:
    """Writes are whole; the purge deletes an expired record's entities apart: a record whose
    part is gone is left out, and a part whose record is gone is never read as one."""
    store = new_table_store(azurite)
    store.dead_letter(DeadLetter("shipments", "invalid_json", "", b"a" * 700_000, message_id="part-gone"))
    store.dead_letter(DeadLetter("shipments", "invalid_json", "", b"b" * 700_000, message_id="record-gone"))
    store.dead_letter(DeadLetter("shipments", "invalid_json", "", b"c" * 10, message_id="whole"))
    by_id = {e["RowKey"]: e for e in rows(store, "shipments")}
    for entity in by_id.values():
        message = by_id[entity["RowKey"].split("|")[0]].get("MessageId")
        if (message, "Part" in entity) in (("part-gone", True), ("record-gone", False)):
            dead_letter_table(store).delete_entity(entity["PartitionKey"], entity["RowKey"])
    assert [(r.message_id, r.body) for r in store.dead_letters("shipments")] == [("whole", b"c" * 10)]


@pytest.mark.parametrize("valid", [False, True], ids=["invalid JSON", "valid but unstorable"])
def test_an_event_near_the_1_mb_limit_is_recorded_at_its_first_delivery(azurite: Azurite, valid: bool) -> None:
    """950 KB: not JSON, or JSON whose tracking record no Table property holds (refused). Either
    is recorded whole at once, and the batch returns (no retry: nothing would change)."""
    event = item("s-1", note="x" * 950_000)
    body = json.dumps(event).encode() if valid else b"{" + b"x" * 950_000
    metadata = {"PartitionContext": meta.Datum(json.dumps({"EventHubName": "items", "PartitionId": "3"}), "json"),
                "PropertiesArray": meta.Datum(json.dumps([{"message_id": "e-big"}]), "json")}  # fmt: skip
    events = [func.EventHubEvent(body=body, trigger_metadata=metadata, sequence_number=7)]
    first_try: Any = SimpleNamespace(retry_context=SimpleNamespace(retry_count=0, max_retry_count=5))
    with fresh_app(azurite):
        consumer = stream_consumer()
        on_eventhub_batch(stream_consumer, events, first_try)  # no RetryLater: recorded
        [record] = consumer.store.dead_letters("item-stream")
    assert (record.message_id, record.body, record.truncated) == ("e-big", body, False)
    assert record.reason == ("store_refused" if valid else "invalid_json")


@pytest.mark.parametrize("size", [640_000, 1_048_576], ids=["one entity, full", "a record and a part"])
def test_every_text_at_its_limit_still_fits_beside_the_body(azurite: Azurite, size: int) -> None:
    """The record's entity at its largest: 10 chunks and each text at its limit in characters
    outside the BMP (12 bytes of JSON each, as the SDK escapes them), under the entity limit
    as Azurite counts it (the entity's JSON)."""
    store = new_table_store(azurite)
    wide = "\U0001f642" * 10_000
    record = DeadLetter("shipments", "invalid_json", wide, b"z" * size, message_id=wide, correlation_id=wide,
                        key_id=wide, fingerprint="f" * 64, stored_fingerprint="e" * 64, delivery_count=3)  # fmt: skip
    store.dead_letter(record)
    [stored] = store.dead_letters("shipments")
    assert stored.body == record.body and len(stored.detail) == 8_000 and len(stored.message_id or "") == 1_024
