"""The batch trigger (cardinality many): postings to one account commit many per request,
and a conflict inside a batch isolates its message — on a real Azurite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

import recipes
from shared.idempotency.functions import RetryLater
from shared.idempotency.stores import DedupStore, TableStore
from shared.ledger import message_id
from tests.functions import fresh_app, servicebus_message, store_down, user_function
from tools.azurite import Azurite

ledger = recipes.module("ledger")

ledger_batch = user_function("ledger_batch")


@pytest.fixture
def store(azurite: Azurite) -> Iterator[DedupStore]:
    with fresh_app(azurite, DEDUP_CACHE_SIZE="0"):
        yield ledger.batch_consumer().store


def posting(account: str, posting_id: str, amount: float = 10.0) -> tuple[dict[str, Any], str]:
    body = {"accountId": account, "postingId": posting_id, "amount": amount, "currency": "EUR"}
    return body, message_id(account, posting_id)


def postings(store: DedupStore) -> dict[str, float]:
    return {str(item.entity): item.data["amount"] for item in store.scan() if item.entity is not None}


def count_requests(azurite: Azurite) -> list[str]:
    """Give the app's consumer a store on the same tables whose client records every
    HTTP request it sends (azure-core's raw_request_hook)."""
    consumer = ledger.batch_consumer()
    assert isinstance(consumer.store, TableStore)
    sent: list[str] = []
    service = TableServiceClient.from_connection_string(
        azurite.connection_string, raw_request_hook=lambda request: sent.append(request.http_request.method)
    )
    consumer.store = TableStore(service, consumer.store.table.table_name, consumer.store.dead_letter_table)
    return sent


def test_a_batch_to_one_account_commits_many_postings_per_request(store: DedupStore, azurite: Azurite) -> None:
    sent = count_requests(azurite)
    messages = [servicebus_message(*posting("acc-1", f"p{i}")) for i in range(100)]
    ledger_batch(messages)
    assert len(postings(store)) == 100
    # 100 postings x 3 operations, at most 100 operations per transaction (their 100 expiry
    # notes wait in memory for a full index row of 250, or a minute)
    assert len(sent) == 4


def test_a_conflict_inside_a_batch_isolates_only_its_message(store: DedupStore) -> None:
    ledger_batch([servicebus_message(*posting("acc-2", "p1", 5.0)), servicebus_message(*posting("acc-2", "p2", 6.0))])
    batch = [
        servicebus_message(*posting("acc-2", "p1", 5.0)),  # duplicate of a committed posting
        servicebus_message(*posting("acc-2", "p2", 99.0)),  # same key, another payload
        servicebus_message(*posting("acc-2", "p3", 7.0)),  # new
        servicebus_message(*posting("acc-2", "p3", 7.0)),  # the same new posting twice in one batch
        servicebus_message(*posting("acc-3", "p1", 8.0)),  # another account: its own transaction
    ]
    ledger_batch(batch)
    stored = sorted((item.data["accountId"], str(item.entity), item.data["amount"]) for item in store.scan()
                    if item.entity is not None)  # fmt: skip
    assert stored == [("acc-2", "posting|p1", 5.0), ("acc-2", "posting|p2", 6.0), ("acc-2", "posting|p3", 7.0),
                      ("acc-3", "posting|p1", 8.0)]  # fmt: skip
    [conflict] = store.dead_letters("ledger")
    assert conflict.reason == "fingerprint_mismatch" and json.loads(conflict.body)["amount"] == 99.0


def test_a_transient_failure_returns_the_whole_batch(store: DedupStore) -> None:
    with store_down(ledger.batch_consumer()), pytest.raises(RetryLater):
        ledger_batch([servicebus_message(*posting("acc-4", "p1"))])
    ledger_batch([servicebus_message(*posting("acc-4", "p1"))])
    assert len(postings(store)) == 1
