"""The example's own wiring in the real Functions worker (4.34.0, lab/runtime): the default
app's functions as shipped, the example's and every recipe's triggers with the fields Azure
needs, the settings their bindings name, the outbox of ``POST /api/orders`` (the recipe
``http``), and the demo's orders delivered through the worker. The library's runtime proof
is tests/runtime/, on the library tests' consumers.

Skips without the worker release, as tests/runtime/test_python_worker.py does."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import azure.functions as func
import pytest

import consumers
import recipes
from lab.blob_import_run import applied_prices, price_lines
from lab.demo import ORDERS
from lab.harness import RunConfig, run
from lab.runtime import build
from lab.runtime.host import WorkerHost
from lab.runtime.triggers import Blob, Http, StorageQueueMessage, blob, http, http_result, storage_queue, timer
from shared.idempotency.functions import housekeeping
from shared.idempotency.keys import DedupKey, consumer_partition
from shared.idempotency.outbox import message_id
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import entities
from shared.idempotency.testing.azurite import Azurite
from tests.runtime.test_python_worker import (  # with its fixtures: this module's own Azurite, table and app
    FUNCTION_KEY,
    app_settings,
    assert_documented_and_deployed,
    configured,
    default_runtime,  # noqa: F401
    settings_named,
    store,  # noqa: F401
    store_server,  # noqa: F401
    table,  # noqa: F401
)


@pytest.fixture(scope="module")
def runtime() -> build.Runtime:
    """The app with every recipe switched on (their modules moved into consumers/)."""
    configured()
    return build.prepare(sorted(recipes.MODULES.values()))  # with the variable set, any failure is an error


@pytest.fixture(scope="module")
def worker(runtime: build.Runtime, store_server: Azurite, table: str) -> Iterator[WorkerHost]:
    """The app with every recipe, in the worker (indexing only: one transaction path is enough)."""
    with WorkerHost(runtime, app_settings(store_server, table)) as host:
        yield host.start_app()


def an_order(order_id: str, amount: float = 12.5, **extra: Any) -> bytes:
    order = {"orderId": order_id, "customerId": "c-1", "amount": amount, "currency": "EUR",
             "items": [{"sku": "book", "quantity": 1}], **extra}  # fmt: skip
    return json.dumps(order).encode()


def new_id() -> str:
    return "o-" + uuid.uuid4().hex[:12]


# -- indexing ------------------------------------------------------------------------------------

EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {  # function: (trigger type, the binding fields Azure needs)
    "orders": ("serviceBusTrigger", {"queueName": "%ORDERS_QUEUE%", "dataType": "BINARY"}),
    "order_status": (
        "serviceBusTrigger",
        {"queueName": "%ORDER_STATUS_QUEUE%", "dataType": "BINARY", "isSessionsEnabled": True},
    ),
    "billing": (
        "serviceBusTrigger",
        {"topicName": "%ORDER_TOPIC%", "subscriptionName": "%BILLING_SUBSCRIPTION%", "dataType": "BINARY"},
    ),
    "shipping": (
        "serviceBusTrigger",
        {"topicName": "%ORDER_TOPIC%", "subscriptionName": "%SHIPPING_SUBSCRIPTION%", "dataType": "BINARY"},
    ),
    "ledger_batch": ("serviceBusTrigger", {"queueName": "%LEDGER_QUEUE%", "cardinality": "MANY", "dataType": "BINARY"}),
    "account_balances": ("serviceBusTrigger", {"queueName": "%BALANCES_QUEUE%", "dataType": "BINARY"}),
    "order_events": ("eventGridTrigger", {}),
    "order_returns": ("queueTrigger", {"queueName": "%RETURNS_QUEUE%", "connection": "StorageQueueConnection"}),
    "price_import": (
        "blobTrigger",
        {"path": "%IMPORTS_CONTAINER%/{name}", "connection": "ImportsConnection", "source": "EventGrid"},
    ),
    "orders_api": ("httpTrigger", {"route": "orders", "methods": ["POST"], "authLevel": "FUNCTION"}),
    "events_api": ("httpTrigger", {"route": "events", "methods": ["POST", "OPTIONS"], "authLevel": "FUNCTION"}),
    "reconcile_claims": ("timerTrigger", {"schedule": "0 */15 * * * *", "useMonitor": True}),
    "purge_markers": ("timerTrigger", {"schedule": "0 */5 * * * *", "useMonitor": True}),
    "sweep_markers": ("timerTrigger", {"schedule": "0 0 4 * * 0", "useMonitor": True}),
    "dispatch_outbox": ("timerTrigger", {"schedule": "0 */5 * * * *", "useMonitor": True}),
    "daily_reminders": ("timerTrigger", {"schedule": "0 0 6 * * *", "useMonitor": True}),
    "shipment_tracking": (
        "eventHubTrigger",
        {"eventHubName": "%SHIPMENT_HUB%", "cardinality": "MANY", "dataType": "BINARY"},
    ),
}


def declared_functions(modules: Sequence[ModuleType] = (), needs: Iterable[str] = ()) -> set[str]:
    """The functions ``modules`` declare with the housekeeping ``needs`` call for, as
    function_app registers them (indexed in this process); by default the app's consumers/
    and every recipe, with the needs of the documented settings (none)."""
    app = func.FunctionApp()
    modules = modules or list(dict.fromkeys([*consumers.modules(), *recipes.every()]))  # a recipe on is both
    blueprints = [m.bp for m in modules]
    for blueprint in [*blueprints, *housekeeping(needs, watched=blueprints)]:
        app.register_functions(blueprint)
    return {str(f.get_function_name()) for f in app.get_functions()}


def test_the_default_app_indexes_its_consumers_and_the_housekeeping_they_need(
    default_runtime: build.Runtime, store_server: Azurite, table: str
) -> None:
    """No recipe switched on: the worker indexes what consumers/ declares and the timers its
    consumers need — as the template ships, the Service Bus and Event Grid consumers and the
    markers' purge and sweep, the canary and the audit (it reads Service Bus), nothing else."""
    with WorkerHost(default_runtime, app_settings(store_server, table)) as host:
        host.start_app()
        indexed = set(host.functions)
    assert indexed == declared_functions(consumers.modules(), consumers.needs())
    if {m.__name__ for m in consumers.modules()} == {"consumers.orders", "consumers.order_events"}:  # as shipped
        assert indexed == {"orders", "order_events", "purge_markers", "sweep_markers", "send_canaries",
                           "audit_consumers"}  # fmt: skip


def test_the_worker_indexes_and_loads_every_function(worker: WorkerHost) -> None:
    """Every function the app declares with every recipe switched on (read from function_app
    in this process, not a list kept here: a new consumer is checked too) is indexed by the
    worker; the example's triggers carry the fields Azure needs."""
    assert set(worker.functions) == declared_functions()
    for name, (trigger_type, fields) in EXPECTED.items():
        if name not in worker.functions:  # the app removed this example (the equality above holds)
            continue
        trigger = worker.trigger(name)
        assert trigger["type"] == trigger_type and trigger["direction"] == "IN", name
        assert {key: trigger.get(key) for key in fields} == fields, name
        if trigger_type == "serviceBusTrigger":
            assert trigger["connection"] == "ServiceBusConnection", name
        outputs = [b for b in worker.functions[name].bindings if b["direction"] == "OUT"]
        assert outputs == ([{"direction": "OUT", "type": "http", "name": "$return"}] if trigger_type == "httpTrigger"
                           else []), name  # fmt: skip


def test_every_setting_a_binding_names_is_documented_and_deployed(worker: WorkerHost) -> None:
    """With every recipe on: the example's queue and hub among them."""
    named, connections = settings_named(worker.functions.values())
    assert {"ORDERS_QUEUE", "SHIPMENT_HUB"} <= named and {"ServiceBusConnection", "EventHubConnection"} <= connections
    assert_documented_and_deployed(named, connections)


# -- the outbox of POST /api/orders (the recipe ``http``) ------------------------------------------
# An order accepted with ORDER_ACCEPTED_TOPIC set publishes OrderAccepted exactly once, with the
# same MessageId on every re-send — and when its first send fails, the order is still accepted
# (201), its message parked and sent by the ``dispatch_outbox`` timer. The sender writes what it
# sends to a file (DEDUP_SENDER=file); a missing folder fails a send.


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[WorkerHost, Path]]:
    configured()
    runtime = build.prepare(["orders_api"])  # the recipe ``http`` switched on
    with tempfile.TemporaryDirectory(prefix="runtime-http-outbox-") as folder, Azurite() as azurite:
        sent = Path(folder) / "out" / "sent.jsonl"
        settings = {**app_settings(azurite, "ho" + uuid.uuid4().hex[:12]), "ORDER_ACCEPTED_TOPIC": "order-events",
                    "DEDUP_SENDER": "file", "DEDUP_SENDER_FILE": str(sent),
                    "DEDUP_OUTBOX_SWEEP_DELAY": "PT0S"}  # the sweep may send at once  # fmt: skip
        with WorkerHost(runtime, settings) as host:
            yield host.start_app(), sent


def post(worker: WorkerHost, order_id: str, key: str) -> int:
    headers = {"Content-Type": "application/json", "x-functions-key": FUNCTION_KEY, "Idempotency-Key": key}
    response = worker.invoke("orders_api", http(worker.trigger("orders_api"), Http("POST", "/api/orders", headers,
                                                                                   an_order(order_id))))  # fmt: skip
    assert worker.failed(response) is None
    return http_result(worker.pb, response)[0]


def published(sent: Path, order_id: str) -> list[str]:
    lines = [json.loads(line) for line in sent.read_text().splitlines()] if sent.exists() else []
    return [line["messageId"] for line in lines if line["body"]["orderId"] == order_id]


def sweep(worker: WorkerHost) -> None:
    assert worker.failed(worker.invoke("dispatch_outbox", timer(worker.trigger("dispatch_outbox")))) is None


def test_an_order_accepted_over_http_publishes_order_accepted_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    order_id, key = new_id(), uuid.uuid4().hex
    assert [post(worker, order_id, k) for k in (key, key, uuid.uuid4().hex)] == [201, 201, 201]  # retries replay
    sweep(worker)
    assert published(sent, order_id) == [message_id(DedupKey("orders-api", order_id), "accepted")]


def test_an_order_whose_first_send_fails_is_accepted_and_its_message_swept_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    order_id, key = new_id(), uuid.uuid4().hex
    sent.parent.rename(sent.parent.with_name("away"))  # every send fails now
    try:
        assert post(worker, order_id, key) == 201  # committed and parked: the order is accepted
        assert post(worker, order_id, key) == 201  # a retry replays; its send fails too
        sweep(worker)  # the sweep's send fails as well: the key waits for the next one
    finally:
        sent.parent.with_name("away").rename(sent.parent)
    assert published(sent, order_id) == []
    deadline = time.monotonic() + 30  # a key whose sweep failed is due again a second later
    while not published(sent, order_id) and time.monotonic() < deadline:
        sweep(worker)
    sweep(worker)  # nothing left: never sent twice
    assert published(sent, order_id) == [message_id(DedupKey("orders-api", order_id), "accepted")]


def test_a_queue_message_through_the_worker_is_recorded_once_and_refused_at_its_first_dequeue(
    worker: WorkerHost, store: TableStore
) -> None:
    """The queue recipe with the trigger data the host sends: a message dequeued again (a lease
    lapsed) and a producer's retry (a new message id) make one return; an invalid one is
    dead-lettered with its reason at its first dequeue and acknowledged (deleted, not retried)."""
    trigger, return_id = worker.trigger("order_returns"), "r-" + uuid.uuid4().hex[:12]
    body = json.dumps({"returnId": return_id, "orderId": "o-1", "amount": 3.5}).encode()
    for message in (
        StorageQueueMessage(body, 1, "q-1"),
        StorageQueueMessage(body, 2, "q-1"),
        StorageQueueMessage(body),
    ):
        assert worker.failed(worker.invoke("order_returns", storage_queue(trigger, message))) is None
    assert [e["returnId"] for e in entities(store, "return") if e["returnId"] == return_id] == [return_id]
    bad = json.dumps({"returnId": return_id + "-bad", "amount": -1}).encode()
    assert (
        worker.failed(worker.invoke("order_returns", storage_queue(trigger, StorageQueueMessage(bad, 1, "q-3"))))
        is None
    )
    [record] = [d for d in store.dead_letters("returns") if d.message_id == "q-3"]
    assert (record.reason, record.delivery_count) == ("schema_violation", 1)


def test_a_blob_through_the_worker_applies_each_record_once_and_a_malformed_one_is_refused_whole(
    worker: WorkerHost, store: TableStore
) -> None:
    """The blob-import recipe with the trigger data the host sends (the content as bytes, its
    path, Properties and Metadata): its records applied once, the same content run again (a
    duplicate event) applies nothing, a corrected file only what it changed; a malformed file is
    dead-lettered whole with its line, and acknowledged."""
    trigger, name = worker.trigger("price_import"), f"prices-{uuid.uuid4().hex[:8]}.jsonl"
    partition = consumer_partition("prices", f"imports/{name}")
    uploaded = datetime.now(UTC)
    for content, modified in ((price_lines(60), uploaded), (price_lines(60), uploaded),  # an event twice
                              (price_lines(60, changed={7: 0.07}), uploaded + timedelta(seconds=1))):  # fmt: skip
        invocation = blob(trigger, Blob("imports", name, content, modified=modified))
        assert worker.failed(worker.invoke("price_import", invocation)) is None
    versions = sorted(version for sku, version in applied_prices(store, partition) if sku == "s-7")
    assert sum(applied_prices(store, partition).values()) == 61
    assert versions == [int(uploaded.timestamp()), int(uploaded.timestamp()) + 1]  # Last-Modified: the version
    bad = Blob("imports", "bad-" + name, price_lines(5)[:-10])
    assert worker.failed(worker.invoke("price_import", blob(trigger, bad))) is None
    [record] = [d for d in store.dead_letters("prices") if d.key_id == f"imports/bad-{name}"]
    assert record.reason == "file_malformed" and record.detail.startswith("line 5:")


def test_the_demo_delivers_through_the_worker(store_server: Azurite) -> None:
    """DEMO_RUNTIME=worker: the example's orders, with competing deliveries, duplicates, lost
    acknowledgements and a store outage, through the worker; the checker reads Azurite."""
    configured()
    config = RunConfig(messages=60, workers=4, dup_rate=0.4, fault_rate=0.05, seed=20261130, outage=True,
                       table="rx" + uuid.uuid4().hex[:12], runtime="worker")  # fmt: skip
    report = run(config, store_server, ORDERS)
    assert report.violations == []
    assert (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.effects_applied == report.messages - report.dead_lettered
    assert report.outcomes["processed"] == report.effects_applied  # counted from the worker's own log lines
    assert report.outcomes["duplicate"] > 0 and report.broker_dead_lettered == 0  # the outage, waited out
    assert report.store_restarts == 1 and set(report.faults) <= {"crash_before_ack", "lost_ack"}
