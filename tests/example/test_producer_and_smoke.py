"""The producer's messages and the smoke test's report, locally; the real send runs only
against a deployed namespace (SMOKE_SERVICEBUS_NAMESPACE)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient
from opentelemetry.sdk.trace import TracerProvider

from consumers import orders
from lab.client.producer import order_message, shipped_event
from lab.client.smoke import main, make_plan, report
from shared.idempotency.keys import consumer_partition, encode_key
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app, servicebus_message, user_function

ORDER = {"orderId": "o-42", "customerId": "c-1", "amount": 12.5, "currency": "EUR",
         "items": [{"sku": "book", "quantity": 1}]}  # fmt: skip


def test_an_order_message_carries_the_business_id_and_the_trace() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("send") as span:
        message = order_message(ORDER, correlation_id="corr-1")
    assert message.message_id == "o-42" and message.correlation_id == "corr-1"
    assert message.content_type == "application/json"
    assert json.loads(str(message)) == ORDER
    properties = message.application_properties or {}
    traceparent = properties.get("traceparent")
    context = span.get_span_context()
    assert str(traceparent).split("-")[1:3] == [f"{context.trace_id:032x}", f"{context.span_id:016x}"]


def test_a_retried_order_is_the_same_message() -> None:
    first, retry = order_message(ORDER), order_message(dict(ORDER))
    assert first.message_id == retry.message_id and str(first) == str(retry)
    assert first.correlation_id != retry.correlation_id  # a fresh correlation per send is fine: not the key


def test_a_shipped_event_keeps_its_id_across_retries() -> None:
    first = shipped_event("o-42", "DHL", "T-1", event_id="shipment-7")
    retry = shipped_event("o-42", "DHL", "T-1", event_id="shipment-7")
    assert (first.id, first.source) == (retry.id, retry.source) == ("shipment-7", "/warehouse/eu")
    assert first.type == "com.example.order.shipped" and first.data == {"orderId": "o-42", "carrier": "DHL",
                                                                        "trackingNumber": "T-1"}  # fmt: skip


def test_clients_are_built_from_settings_with_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.client.producer import eventgrid_client, servicebus_client

    monkeypatch.setenv("EVENTGRID_TOPIC_ENDPOINT", "https://topic.westeurope-1.eventgrid.azure.net/api/events")
    monkeypatch.setenv("SERVICEBUS_FULLY_QUALIFIED_NAMESPACE", "ns.servicebus.windows.net")
    monkeypatch.delenv("SERVICEBUS_CONNECTION_STRING", raising=False)
    assert type(eventgrid_client()).__name__ == "EventGridPublisherClient"  # no request is sent yet
    assert servicebus_client().fully_qualified_namespace == "ns.servicebus.windows.net"


def test_the_plan_has_the_requested_shares() -> None:
    plan = make_plan(40, 0.25, 3, seed=1)
    assert len(plan.orders) == 40 and len(plan.duplicates) == 10 and len(plan.mismatches) == 3
    assert all(d in plan.orders for d in plan.duplicates)
    assert all(m["orderId"] in {o["orderId"] for o in plan.orders} and m not in plan.orders for m in plan.mismatches)


@pytest.fixture
def store(azurite: Azurite) -> Iterator[DedupStore]:
    with fresh_app(azurite):
        yield orders.queue_consumer().store


def deliver(plan_sends: list[dict[str, object]]) -> None:
    orders = user_function("orders")
    for order in plan_sends:
        orders(servicebus_message(dict(order), str(order["orderId"])))


def test_the_report_counts_what_the_store_holds(store: DedupStore) -> None:
    plan = make_plan(20, 0.3, 2, seed=2)
    deliver(plan.sends[:-1])  # one mismatch not delivered yet: never mind
    result = report(store, "orders", plan)
    assert (result.written_once, result.written_twice, result.missing) == (20, [], [])
    assert result.dead_lettered == {"fingerprint_mismatch": 1}
    assert result.exit_code == 0
    assert "orders written once: 20" in result.render()


def test_the_report_says_when_the_operator_role_cannot_read_dead_letters(store: DedupStore, azurite: Azurite) -> None:
    """The operator role reads the records table only: the dead-letter table answers 403."""
    plan = make_plan(3, 0.0, 0, seed=4)
    deliver(plan.orders)
    assert isinstance(store, TableStore)
    wrong_key = azurite.connection_string.replace("AccountKey=", "AccountKey=AAAA")
    denied = TableStore(TableServiceClient.from_connection_string(wrong_key), store.table.table_name,
                        store.dead_letter_table)  # fmt: skip
    store.dead_letters = denied.dead_letters  # type: ignore[method-assign]
    result = report(store, "orders", plan)
    assert (result.written_once, result.dead_lettered, result.exit_code) == (3, None, 0)
    assert "not readable with the operator role" in result.render()


def test_the_report_fails_on_a_double_write_and_on_missing_orders(store: DedupStore) -> None:
    plan = make_plan(5, 0.0, 0, seed=3)
    deliver(plan.orders[:4])
    assert isinstance(store, TableStore)
    doubled = plan.orders[0]["orderId"]
    store.table.create_entity({"PartitionKey": encode_key(consumer_partition("orders", doubled)),
                               "RowKey": encode_key("charge|extra"),
                               "orderId": doubled, "amount": 1.0})  # fmt: skip
    result = report(store, "orders", plan)
    assert result.written_twice == [doubled] and result.missing == [plan.orders[4]["orderId"]]
    assert result.exit_code == 1


@pytest.mark.skipif(not os.environ.get("SMOKE_SERVICEBUS_NAMESPACE"),
                    reason="sends to a deployed environment: set SMOKE_SERVICEBUS_NAMESPACE (and the app's store "
                           "settings) after `azd up`")  # fmt: skip
def test_the_smoke_test_against_a_deployed_environment() -> None:
    os.environ.setdefault("SERVICEBUS_FULLY_QUALIFIED_NAMESPACE", os.environ["SMOKE_SERVICEBUS_NAMESPACE"])
    assert main(["--orders", "20", "--duplicate-share", "0.3", "--mismatches", "2", "--wait", "300"]) == 0


@pytest.mark.parametrize("mistake", ["an unreachable namespace", "a mistyped table"])
def test_the_smoke_test_that_cannot_run_says_so_in_one_line_exit_2(azurite: Azurite, mistake: str) -> None:
    """Exit 1 keeps its one meaning (an order written twice): what it cannot do is 2, one line."""
    from shared.idempotency.functions import shared_store
    from shared.idempotency.testing.azurite import free_port
    from tests.integration.operators import run_tool

    nowhere = (
        f"Endpoint=sb://127.0.0.1:{free_port()};SharedAccessKeyName=x;SharedAccessKey=eQ==;UseDevelopmentEmulator=true"
    )
    with fresh_app(azurite):
        shared_store()  # the app's tables exist
        typo = {"DEDUP_TABLE": "nosuchtable"} if mistake == "a mistyped table" else {}
        done = run_tool("lab.client.smoke", "--orders", "2", "--wait", "0", SERVICEBUS_CONNECTION_STRING=nowhere,
                        SERVICEBUS_QUEUE="orders", **typo)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert done.stderr.startswith("smoke: error: ") and "Traceback" not in done.stderr
    assert ("table 'nosuchtable' does not exist" in done.stderr) == (mistake == "a mistyped table")
