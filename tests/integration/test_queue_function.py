"""The `items` Service Bus function (tests/app.py), driven with real ServiceBusMessage objects against
a real Azurite."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient

from shared.idempotency import Delivery, Effects, Entity, IdempotentConsumer, Outcome
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions import RetryLater, shared_store
from shared.idempotency.keys import DedupKey, consumer_partition, encode_key
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import Commit
from shared.idempotency.stores._records import MARKER_KIND
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite
from tests.app import effects_by_item, item, queue_consumer
from tests.functions import app_settings, fresh_app, servicebus_message, store_down, user_function

items = user_function("items")
HOUR = timedelta(hours=1)


@pytest.fixture
def tables(azurite: Azurite) -> Iterator[tuple[TableClient, TableClient]]:
    with fresh_app(azurite) as name:
        service = TableServiceClient.from_connection_string(azurite.connection_string)
        shared_store()  # creates the tables
        yield service.get_table_client(name), service.get_table_client(name + "dl")


def effects(table: TableClient, item_id: str) -> tuple[int, int]:
    """(items, postings) really stored for one item id, in the app's store."""
    assert queue_consumer().store.table.table_name == table.table_name  # type: ignore[attr-defined]
    found = effects_by_item(queue_consumer().store, item_id).get(item_id, Counter())
    return found["item"], found["posting"]


def posting_amounts(table: TableClient, item_id: str) -> list[float]:
    partition = encode_key(consumer_partition("items", item_id))
    found = table.query_entities("PartitionKey eq @pk", parameters={"pk": partition})
    return [e["amount"] for e in found if e["RowKey"].startswith("posting")]


def test_a_new_item_writes_one_item_and_one_posting(tables: tuple[TableClient, TableClient]) -> None:
    table, _ = tables
    body = item(amount=12.5)
    items(servicebus_message(body, body["id"]))
    assert effects(table, body["id"]) == (1, 1)
    assert posting_amounts(table, body["id"]) == [12.5]


def test_redeliveries_and_reserialised_copies_apply_once(tables: tuple[TableClient, TableClient]) -> None:
    table, dead = tables
    body = item()
    items(servicebus_message(body, body["id"]))
    reordered = dict(reversed(list(body.items())))
    for count in range(2, 5):
        items(servicebus_message(reordered, body["id"], delivery_count=count))
    assert effects(table, body["id"]) == (1, 1)
    assert list(dead.list_entities()) == []


def test_eight_concurrent_deliveries_apply_once(tables: tuple[TableClient, TableClient]) -> None:
    table, _ = tables
    body = item()
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def deliver() -> None:
        barrier.wait()
        try:
            items(servicebus_message(body, body["id"]))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert effects(table, body["id"]) == (1, 1)


def test_same_key_different_payload_is_dead_lettered_not_written(tables: tuple[TableClient, TableClient]) -> None:
    table, dead = tables
    body = item(amount=10)
    items(servicebus_message(body, body["id"]))
    items(servicebus_message({**body, "amount": 99}, body["id"], correlation_id="corr-7"))
    assert posting_amounts(table, body["id"]) == [10]
    [record] = list(dead.list_entities())
    assert record["Reason"] == "fingerprint_mismatch" and record["CorrelationId"] == "corr-7"
    assert record["Fingerprint"] != record["StoredFingerprint"]


def test_the_mismatch_alert_carries_key_and_both_fingerprints(
    tables: tuple[TableClient, TableClient], caplog: pytest.LogCaptureFixture
) -> None:
    body = item(amount=10)
    items(servicebus_message(body, body["id"]))
    with caplog.at_level("INFO", logger="idempotency"):
        items(servicebus_message({**body, "amount": 11}, body["id"], correlation_id="corr-8"))
    [alert] = [r for r in caplog.records if r.levelname == "ERROR"]
    fields = fields_of(alert)
    assert fields["outcome"] == "conflict" and fields["dedup_key"] == body["id"]
    assert fields["correlation_id"] == "corr-8" and fields["consumer"] == "items"
    assert (
        fields["fingerprint"] and fields["stored_fingerprint"] and fields["fingerprint"] != fields["stored_fingerprint"]
    )


BAD_DELIVERIES: list[tuple[str, Callable[[], tuple[bytes | dict[str, Any], str | None]]]] = [
    ("invalid_json", lambda: (b'{"id": ', "bad-json")),
    ("invalid_json", lambda: (b"\xff\xfe not utf-8", "not-utf8")),
    ("schema_violation", lambda: ({**item("neg"), "amount": -1}, "neg")),
    ("schema_violation", lambda: ({k: v for k, v in item("noamount").items() if k != "amount"}, "noamount")),
    ("missing_key", lambda: (item(), None)),
    ("key_mismatch", lambda: (item("i-1"), "i-2")),
]


@pytest.mark.parametrize(("reason", "make"), BAD_DELIVERIES)
def test_invalid_messages_are_dead_lettered_with_reason_and_nothing_written(
    tables: tuple[TableClient, TableClient], reason: str, make: Callable[[], tuple[Any, str | None]]
) -> None:
    table, dead = tables
    body, message_id = make()
    items(servicebus_message(body, message_id))
    items(servicebus_message(body, message_id, delivery_count=2))  # redelivered: still one record
    assert list(table.list_entities()) == []
    [record] = list(dead.list_entities())
    assert record["Reason"] == reason and record["Detail"]


def test_a_store_down_at_start_abandons_the_message() -> None:
    down = Azurite()  # never started: nothing listens on its port
    with app_settings(DEDUP_STORAGE_CONNECTION=down.connection_string, DEDUP_TABLE="itemsdown"):
        body = item()
        with pytest.raises(StoreUnavailable):  # raised: the host abandons, nothing is lost
            items(servicebus_message(body, body["id"]))


def test_markers_never_exist_without_their_effects(tables: tuple[TableClient, TableClient]) -> None:
    table, _ = tables
    for _ in range(20):
        body = item()
        items(servicebus_message(body, body["id"]))
    markers = [e for e in table.list_entities() if e.get("Kind") == MARKER_KIND]
    assert len(markers) == 20
    for marker in markers:
        assert effects(table, marker["KeyId"]) == (1, 1)


def test_store_errors_are_retried_by_the_broker(tables: tuple[TableClient, TableClient], azurite: Azurite) -> None:
    body = item()
    with store_down(queue_consumer()), pytest.raises(RetryLater) as info:
        items(servicebus_message(body, body["id"]))
    assert info.value.result.outcome.value == "transient"
    items(servicebus_message(body, body["id"], delivery_count=2))
    assert effects(tables[0], body["id"]) == (1, 1)


def test_a_handler_with_more_effects_than_one_commit_holds_is_invalid(azurite: Azurite) -> None:
    """It could never succeed: dead-lettered with a reason, not retried until the DLQ."""
    with fresh_app(azurite):
        store = queue_consumer().store
        consumer = IdempotentConsumer("too-many", store, lambda body, context: Effects(
            [Entity(f"line|{i}", {"n": i}) for i in range(store.max_effects + 1)]))  # fmt: skip
        result = consumer.process(Delivery(body=b'{"n": 1}', message_id="m-1"))
        assert (result.outcome, result.reason) == (Outcome.INVALID, "too_many_effects")
        assert [r.reason for r in store.dead_letters("too-many")] == ["too_many_effects"]
        too_many, expires = [Entity(f"line|{i}", {"n": i}) for i in range(store.max_effects + 1)], utcnow() + HOUR
        for commits in ([too_many], [too_many, []]):  # the store refuses it too, alone or with others
            with pytest.raises(ValueError, match="at most"):
                store.commit_many([Commit(DedupKey("too-many", f"c-{i}"), "p", "fp", effects, None, expires)
                                   for i, effects in enumerate(commits)])  # fmt: skip
