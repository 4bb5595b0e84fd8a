"""The orders example's own consumer (consumers/orders.py): what its schema
allows fits the store, it writes one order and one charge, and PAYMENT_API_URL makes the
charge a two-phase step. Moved unchanged from the library tests, which prove the same
behaviours on tests/app.py's items."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient

from consumers import orders as orders_app
from lab.order_effects import OrderEffects, effects_by_order
from lab.payment_service import PaymentService
from shared.idempotency.functions import shared_store
from shared.idempotency.keys import DedupKey, consumer_partition, encode_key
from shared.idempotency.stores import DeadLetter, DedupStore, Marker, State, TableStore
from shared.idempotency.testing import entities
from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app, servicebus_message, user_function

orders = user_function("orders")
SHORT_LEASE = "PT1S"


def an_order(order_id: str | None = None, **changes: Any) -> dict[str, Any]:
    order = {"orderId": order_id or f"o-{uuid.uuid4().hex[:8]}", "customerId": "c-1", "amount": 12.5,
             "currency": "EUR", "items": [{"sku": "book", "quantity": 1}]}  # fmt: skip
    return {**order, **changes}


def dead_letters(store: DedupStore, scope: str) -> list[DeadLetter]:
    return store.dead_letters(scope)


@pytest.fixture
def store(azurite: Azurite) -> Iterator[DedupStore]:
    with fresh_app(azurite):
        yield shared_store()


# -- from tests/integration/test_faults_classified.py ----------------------------------------


def test_a_schema_valid_order_of_non_ascii_skus_at_the_schema_limits_is_processed(store: DedupStore) -> None:
    """100 items of 64-emoji SKUs: 25,800 characters of items as UTF-8 text (as ASCII escapes,
    which cost 12 characters an emoji, it was over Table Storage's 32 K-character property)."""
    order = an_order(items=[{"sku": "😀" * 63 + str(i % 10), "quantity": 10_000} for i in range(100)])
    orders(servicebus_message(order, order["orderId"]))
    [stored] = entities(store, "order")
    assert json.loads(stored["items"]) == order["items"]
    assert dead_letters(store, "orders") == []


# -- the orders function, invoked as the host invokes it --------------------------------------


@pytest.fixture
def tables(azurite: Azurite) -> Iterator[tuple[TableClient, TableClient]]:
    with fresh_app(azurite) as name:
        service = TableServiceClient.from_connection_string(azurite.connection_string)
        shared_store()  # creates the tables
        yield service.get_table_client(name), service.get_table_client(name + "dl")


def effects(table: TableClient, order_id: str) -> tuple[int, int]:
    """(orders, charges) really stored for one order id, in the app's store."""
    assert orders_app.queue_consumer().store.table.table_name == table.table_name  # type: ignore[attr-defined]
    found = effects_by_order(orders_app.queue_consumer().store, order_id).get(order_id, OrderEffects())
    return found.orders, found.charges


def charge_amounts(table: TableClient, order_id: str) -> list[float]:
    partition = encode_key(consumer_partition("orders", order_id))
    found = table.query_entities("PartitionKey eq @pk", parameters={"pk": partition})
    return [e["amount"] for e in found if e["RowKey"].startswith("charge")]


def test_a_new_order_writes_one_order_and_one_charge(tables: tuple[TableClient, TableClient]) -> None:
    table, _ = tables
    order = an_order()
    orders(servicebus_message(order, order["orderId"]))
    assert effects(table, order["orderId"]) == (1, 1)
    assert charge_amounts(table, order["orderId"]) == [12.5]


# -- from tests/integration/test_two_phase.py ------------------------------------------------


@pytest.fixture
def payments() -> Iterator[PaymentService]:
    with PaymentService() as service:
        yield service


@pytest.fixture
def app(azurite: Azurite, payments: PaymentService) -> Iterator[TableStore]:
    """The real app, with a payment API and a short lease."""
    with fresh_app(azurite, PAYMENT_API_URL=payments.url, DEDUP_LEASE=SHORT_LEASE, DEDUP_IN_FLIGHT_WAIT="PT0S"):
        store = orders_app.queue_consumer().store
        assert isinstance(store, TableStore)
        yield store


def step_marker(store: TableStore, order_id: str) -> Marker | None:
    return store.get(DedupKey("orders", order_id, "charge"), consumer_partition("orders", order_id))


def charge_key(order_id: str) -> str:
    return DedupKey("orders", order_id, "charge").downstream_key


def test_a_new_order_is_charged_once_then_written(app: TableStore, payments: PaymentService) -> None:
    order = an_order()
    orders(servicebus_message(order, order["orderId"]))
    orders(servicebus_message(order, order["orderId"], delivery_count=2))
    assert payments.charges_per("orderId") == {order["orderId"]: 1}
    found = effects_by_order(app, order["orderId"])[order["orderId"]]
    assert (found.orders, found.charges) == (1, 1)
    marker = step_marker(app, order["orderId"])
    assert marker is not None and marker.state is State.COMPLETED and marker.result["id"] == payments.accepted[0]["id"]
    assert payments.requests[charge_key(order["orderId"])] == 1  # the redelivery replayed the stored result
