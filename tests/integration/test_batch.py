"""The batch trigger (cardinality many): items of one partition commit many per request,
and a conflict inside a batch isolates its message — on a real Azurite. The test app's
item_batch partitions items by the first character of their id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency.functions import RetryLater
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing.azurite import Azurite
from tests.app import batch_consumer, effects_by_item, item
from tests.functions import fresh_app, servicebus_message, store_down, user_function

item_batch = user_function("item_batch")


@pytest.fixture  # its own: the batch consumer's store, with no cache (conftest's items_store keeps one)
def store(azurite: Azurite) -> Iterator[DedupStore]:
    with fresh_app(azurite, DEDUP_CACHE_SIZE="0"):
        yield batch_consumer().store


def message(item_id: str, amount: float = 10.0) -> Any:
    """An item's message (MessageId = its id): its partition is the id's first character."""
    return servicebus_message(item(item_id, amount), item_id)


def count_requests(azurite: Azurite) -> list[str]:
    """Give the app's consumer a store on the same tables whose client records every
    HTTP request it sends (azure-core's raw_request_hook)."""
    consumer = batch_consumer()
    assert isinstance(consumer.store, TableStore)
    sent: list[str] = []
    service = TableServiceClient.from_connection_string(
        azurite.connection_string, raw_request_hook=lambda request: sent.append(request.http_request.method)
    )
    consumer.store = TableStore(service, consumer.store.table.table_name, consumer.store.dead_letter_table)
    return sent


def test_a_batch_to_one_partition_commits_many_items_per_request(store: DedupStore, azurite: Azurite) -> None:
    sent = count_requests(azurite)
    item_batch([message(f"a-{i}") for i in range(100)])
    assert effects_by_item(store) == {f"a-{i}": {"item": 1, "posting": 1} for i in range(100)}
    # 100 items x 4 operations (marker, guard, item, posting), at most 100 operations per
    # transaction: 25 items each (their 100 expiry notes wait in memory for a full index row
    # of 250, or a minute)
    assert len(sent) == 4


def test_a_conflict_inside_a_batch_isolates_only_its_message(store: DedupStore) -> None:
    item_batch([message("b-1", 5.0), message("b-2", 6.0)])
    batch = [
        message("b-1", 5.0),  # duplicate of a committed item
        message("b-2", 99.0),  # same key, another payload
        message("b-3", 7.0),  # new
        message("b-3", 7.0),  # the same new item twice in one batch
        message("c-1", 8.0),  # another partition: its own transaction
    ]
    item_batch(batch)
    stored = sorted((item.data["itemId"], str(item.entity).partition("|")[0], item.data["amount"])
                    for item in store.scan() if item.entity is not None)  # fmt: skip
    assert stored == [("b-1", "item", 5.0), ("b-1", "posting", 5.0), ("b-2", "item", 6.0), ("b-2", "posting", 6.0),
                      ("b-3", "item", 7.0), ("b-3", "posting", 7.0), ("c-1", "item", 8.0),
                      ("c-1", "posting", 8.0)]  # fmt: skip
    [conflict] = store.dead_letters("item-batch")
    assert conflict.reason == "fingerprint_mismatch" and json.loads(conflict.body)["amount"] == 99.0


def test_a_transient_failure_returns_the_whole_batch(store: DedupStore) -> None:
    with store_down(batch_consumer()), pytest.raises(RetryLater):
        item_batch([message("d-1")])
    item_batch([message("d-1")])
    assert effects_by_item(store) == {"d-1": {"item": 1, "posting": 1}}
