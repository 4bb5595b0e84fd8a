"""A write the store can safely send twice is sent again after a timeout or a lost answer, on
both transports: a transaction of upserts (a dead letter, the outbox's parked keys, a cursor),
which leaves the same rows however often it is applied. A create or a conditional write is not: its
second attempt would read the first as a conflict, so the error reaches the caller, which reads
the row back. (Without this, an Event Hubs event whose park met a lost answer on the last try
was lost: the checkpoint moves on whatever the function answers.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient, UpdateMode

from shared.idempotency.stores import DeadLetter, TableStore
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._table_sdk import SdkTransactions, Transactions
from shared.idempotency.stores._transport import transaction_transport
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import PassThrough

QUICK = {"retry_total": 3, "retry_backoff_factor": 0.01}


class FirstTransactionFails(PassThrough):
    """The first transaction (a POST to $batch) times out before it is sent, or is applied and
    its answer lost; the other requests go through. ``posts``: transactions sent to the service."""

    def __init__(self, inner: Any, how: str) -> None:
        super().__init__(inner)
        self.how, self.posts, self._failed = how, 0, False

    def send(self, request: Any, **kwargs: Any) -> Any:
        if not request.url.endswith("$batch"):
            return self._inner.send(request, **kwargs)
        first, self._failed = not self._failed, True
        if first and self.how == "timeout":
            raise ServiceRequestError("injected: connection timed out")
        self.posts += 1
        answer = self._inner.send(request, **kwargs)
        if first:
            raise ServiceResponseError("injected: the answer was lost after the service applied the request")
        return answer


@pytest.fixture(params=["lean", "sdk"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


Faulty = tuple[TableServiceClient, str, Transactions, FirstTransactionFails]


def faulty(azurite: Azurite, kind: str, how: str) -> Faulty:
    """A fresh table, and ``kind``'s transactions on it behind ``FirstTransactionFails``."""
    name = "t" + uuid.uuid4().hex[:16]
    TableServiceClient.from_connection_string(azurite.connection_string).create_table(name)
    if kind == "lean":
        wire = FirstTransactionFails(transaction_transport(), how)
        service = TableServiceClient.from_connection_string(azurite.connection_string, **QUICK)
        return service, name, TableTransactions.of(service, name, transport=wire, **QUICK), wire
    wire = FirstTransactionFails(RequestsTransport(), how)
    service = TableServiceClient.from_connection_string(azurite.connection_string, transport=wire, **QUICK)
    return service, name, SdkTransactions(service.get_table_client(name)), wire


def rows(n: int) -> list[dict[str, Any]]:
    return [{"PartitionKey": "p", "RowKey": f"r{i}", "N": i} for i in range(n)]


@pytest.mark.parametrize("how", ["timeout", "lost"])
def test_a_transaction_of_upserts_is_sent_again_and_applied_once(azurite: Azurite, transport: str, how: str) -> None:
    service, name, transactions, wire = faulty(azurite, transport, how)
    etags = transactions.submit([("upsert", row, {"mode": UpdateMode.REPLACE}) for row in rows(2)])
    assert isinstance(etags, list) and len(etags) == 2 and all(etags)
    assert wire.posts == (1 if how == "timeout" else 2)
    stored = sorted((e["RowKey"], e["N"]) for e in service.get_table_client(name).list_entities())
    assert stored == [("r0", 0), ("r1", 1)]


@pytest.mark.parametrize("operation", ["create", "update"])
def test_a_create_or_a_conditional_write_is_not_sent_again_after_a_lost_answer(
    azurite: Azurite, transport: str, operation: str
) -> None:
    service, name, transactions, wire = faulty(azurite, transport, "lost")
    table = service.get_table_client(name)
    if operation == "update":  # conditional on each row's ETag
        etags = [table.create_entity(row)["etag"] for row in rows(2)]
        condition = {"mode": UpdateMode.REPLACE, "match_condition": MatchConditions.IfNotModified}
        operations: list[Any] = [("update", {**row, "N": 9}, {**condition, "etag": etag})
                                 for row, etag in zip(rows(2), etags, strict=True)]  # fmt: skip
    else:
        operations = [("create", row) for row in rows(2)]
    with pytest.raises(ServiceResponseError):
        transactions.submit(operations)
    assert wire.posts == 1  # applied once, unanswered: its caller reads the rows back
    assert len(list(table.list_entities())) == 2


def test_a_dead_letter_whose_answer_was_lost_is_recorded_once(azurite: Azurite, transport: str) -> None:
    service, name, transactions, wire = faulty(azurite, transport, "lost")
    service.create_table(name + "dl")
    store = TableStore(service, name, name + "dl", transactions=transactions if transport == "lean" else None)
    body = bytes(range(256)) * 2_800  # past a row's ten chunks: the record and a part, one transaction
    store.dead_letter(DeadLetter("orders", "parked", "transient: the carrier is down", body, "m-1"))
    [letter] = store.dead_letters("orders")
    assert (letter.message_id, letter.body, wire.posts) == ("m-1", body, 2)
