"""Runtime conformance: the app run by the real Azure Functions Python worker (release 4.34.0),
started as the host starts it on Linux, over its FunctionRpc gRPC stream, with the invocation
data shaped as the host and its extensions send it (lab/runtime/triggers.py cites the
sources), against a real Azurite. What lands in the store is read back from Azurite.

The library is proved on its tests' own consumers (tests/app.py, one small function per
trigger), deployed as a module of consumers/ beside whatever consumers/ holds, so that the
proof stands without the example; the example's own wiring is checked in
tests/example/test_runtime_example.py.

Runs when FUNCTIONS_PYTHON_WORKER names the release (CI sets it) or `make worker` fetched it;
skips otherwise, and never skips when the variable is set."""

from __future__ import annotations

import json
import re
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import azure.functions as func
import pytest
from azure.data.tables import TableServiceClient

import consumers
from lab.harness import RunConfig, run
from lab.runtime import build
from lab.runtime.host import WorkerHost
from lab.runtime.triggers import (
    Blob,
    Http,
    HubEvent,
    ServiceBusMessage,
    StorageQueueMessage,
    blob,
    cloudevent,
    eventhub_batch,
    http,
    http_result,
    servicebus,
    servicebus_batch,
    storage_queue,
    timer,
)
from shared.idempotency.functions import housekeeping
from shared.idempotency.jobs import occurrence
from shared.idempotency.keys import DedupKey, consumer_partition
from shared.idempotency.outbox import ROWS, message_id
from shared.idempotency.stores import TableStore
from shared.idempotency.testing.azurite import Azurite
from tests import app as library_app
from tests.app import EVENT_TYPE, effects_by_item, item
from tests.targets import ITEMS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = json.loads((ROOT / "local.settings.json.example").read_text())["Values"]
FUNCTION_KEY = "a-function-key"
INFRA_APP = ROOT / "infra" / "modules" / "functionapp.bicep"
TELEMETRY_FLAGS = ("PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY", "PYTHON_ENABLE_OPENTELEMETRY")


def configured() -> None:
    if build.configured() is None:
        pytest.skip(f"set {build.SOURCE_SETTING} to the worker release {build.RELEASE} archive, or run `make worker`")


@pytest.fixture(scope="module")
def runtime() -> build.Runtime:
    """The app with the library tests' consumers deployed into consumers/ beside its own."""
    configured()
    return build.prepare(with_tests=True)  # with the variable set, any failure is an error


@pytest.fixture(scope="module")
def default_runtime() -> build.Runtime:
    """The app as the template ships it."""
    configured()
    return build.prepare()


@pytest.fixture(scope="module")
def store_server() -> Iterator[Azurite]:
    """The module's own Azurite, persisted to disk so that an outage test can stop it."""
    with tempfile.TemporaryDirectory(prefix="runtime-azurite-") as data, Azurite(location=Path(data)) as azurite:
        yield azurite


@pytest.fixture(scope="module")
def table(store_server: Azurite) -> str:
    return "rt" + uuid.uuid4().hex[:12]


def app_settings(azurite: Azurite, table: str) -> dict[str, str]:
    """The documented local settings, pointed at this Azurite."""
    return {**DOCUMENTED, "DEDUP_STORAGE_CONNECTION": azurite.connection_string, "DEDUP_TABLE": table,
            "DEDUP_DEADLETTER_TABLE": table + "dl", "DEDUP_IN_FLIGHT_WAIT": "PT0S",
            "DEDUP_TRANSIENT_WAIT": "PT0S"}  # a failing invocation fails at once: the host abandons  # fmt: skip


@pytest.fixture(scope="module", params=["lean", "sdk"])
def worker(
    runtime: build.Runtime, store_server: Azurite, table: str, request: pytest.FixtureRequest
) -> Iterator[WorkerHost]:
    """The app in the worker, on each transaction path (DEDUP_TABLE_TRANSACTIONS), its
    DEBUG records sent too: the tests read every outcome's log line."""
    settings = {**app_settings(store_server, table), "DEDUP_TABLE_TRANSACTIONS": request.param,
                "PYTHON_ENABLE_DEBUG_LOGGING": "1"}  # fmt: skip
    with WorkerHost(runtime, settings) as host:
        yield host.start_app()


@pytest.fixture(scope="module")  # its own: the tables the worker writes, on the worker's own Azurite, per module
def store(store_server: Azurite, table: str) -> TableStore:
    """The test's own view of the tables the worker writes."""
    service = TableServiceClient.from_connection_string(store_server.connection_string)
    return TableStore(service, table, table + "dl")


def an_item(item_id: str, amount: float = 12.5, **extra: Any) -> bytes:
    """tests/app.py's item as the bytes the worker is sent (tests/runtime and the example's import it)."""
    return json.dumps(item(item_id, amount, **extra)).encode()


def new_id() -> str:
    return "i-" + uuid.uuid4().hex[:12]


def deliver(worker: WorkerHost, function: str, body: bytes, message_id: str | None, **fields: Any) -> str | None:
    """One Service Bus delivery; the failure text, or None when the invocation succeeded
    (the host then completes the message)."""
    message = ServiceBusMessage(body, message_id, **fields)
    return worker.failed(worker.invoke(function, servicebus(worker.trigger(function), message)))


def effects(store: TableStore, item_id: str, consumer: str = "items") -> Counter[str]:
    """The item's stored effects in ``consumer``'s partition: ``{"item": n, "posting": m}``."""
    return effects_by_item(store, item_id, consumer).get(item_id, Counter())


def dead_letter_reasons(store: TableStore, scope: str, message_id: str) -> list[str]:
    return [d.reason for d in store.dead_letters(scope) if d.message_id == message_id]


# -- indexing ------------------------------------------------------------------------------------

EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {  # function: (trigger type, the binding fields Azure needs)
    "items": ("serviceBusTrigger", {"queueName": "items", "dataType": "BINARY"}),
    "item_state": ("serviceBusTrigger", {"queueName": "item-state", "dataType": "BINARY", "isSessionsEnabled": True}),
    "item_subscriber": (
        "serviceBusTrigger",
        {"topicName": "items", "subscriptionName": "subscriber", "dataType": "BINARY"},
    ),
    "item_batch": ("serviceBusTrigger", {"queueName": "item-batch", "cardinality": "MANY", "dataType": "BINARY"}),
    "item_events": ("eventGridTrigger", {}),
    "items_api": ("httpTrigger", {"route": "items", "methods": ["POST"], "authLevel": "FUNCTION"}),
    "item_events_api": (
        "httpTrigger",
        {"route": "item-events", "methods": ["POST", "OPTIONS"], "authLevel": "FUNCTION"},
    ),
    "reconcile_claims": ("timerTrigger", {"schedule": "0 */15 * * * *", "useMonitor": True}),
    "purge_markers": ("timerTrigger", {"schedule": "0 */5 * * * *", "useMonitor": True}),
    "sweep_markers": ("timerTrigger", {"schedule": "0 0 4 * * 0", "useMonitor": True}),
    "dispatch_outbox": ("timerTrigger", {"schedule": "0 */5 * * * *", "useMonitor": True}),
    "item_job": ("timerTrigger", {"schedule": "0 0 6 * * *", "useMonitor": True}),
    "item_stream": ("eventHubTrigger", {"eventHubName": "items", "cardinality": "MANY", "dataType": "BINARY"}),
    "item_queue": ("queueTrigger", {"queueName": "item-queue", "connection": "ItemQueueConnection"}),
    "item_import": (
        "blobTrigger",
        {"path": "item-imports/{name}", "connection": "ItemImportsConnection", "source": "EventGrid"},
    ),
}


def declared_functions(modules: Sequence[ModuleType] | None = None, needs: Iterable[str] = ()) -> set[str]:
    """The functions ``modules`` declare with the housekeeping ``needs`` call for, as
    function_app registers them (indexed in this process); by default what the deployed app
    holds: consumers/ (which may be empty) and the library tests' consumers, with the
    housekeeping they need."""
    if modules is None:
        modules = [*consumers.modules(), library_app]
        needs = {*needs, *consumers.needs(), *library_app.NEEDS}
    app = func.FunctionApp()
    blueprints = [m.bp for m in modules]
    for blueprint in [*blueprints, *housekeeping(needs, watched=blueprints)]:
        app.register_functions(blueprint)
    return {str(f.get_function_name()) for f in app.get_functions()}


def test_the_default_app_indexes_its_consumers_and_the_housekeeping_they_need(
    default_runtime: build.Runtime, store_server: Azurite, table: str
) -> None:
    """No recipe switched on, nothing added: the worker indexes what consumers/ declares and
    the timers its consumers need, whatever consumers/ holds (the example's set as shipped is
    tests/example/test_runtime_example.py's)."""
    with WorkerHost(default_runtime, app_settings(store_server, table)) as host:
        host.start_app()
        indexed = set(host.functions)
    assert indexed == declared_functions(consumers.modules(), consumers.needs())


def test_the_worker_indexes_and_loads_every_function(worker: WorkerHost) -> None:
    """Every function the app declares (read from function_app in this process, not a list
    kept here: a new consumer is checked too) is indexed by the worker; each trigger of the
    library tests' consumers and of the housekeeping carries the fields Azure needs."""
    assert set(worker.functions) == declared_functions()
    for name, (trigger_type, fields) in EXPECTED.items():
        trigger = worker.trigger(name)
        assert trigger["type"] == trigger_type and trigger["direction"] == "IN", name
        assert {key: trigger.get(key) for key in fields} == fields, name
        if trigger_type == "serviceBusTrigger":
            assert trigger["connection"] == "ServiceBusConnection", name
        outputs = [b for b in worker.functions[name].bindings if b["direction"] == "OUT"]
        assert outputs == ([{"direction": "OUT", "type": "http", "name": "$return"}] if trigger_type == "httpTrigger"
                           else []), name  # fmt: skip


def settings_named(functions: Iterable[Any]) -> tuple[set[str], set[str]]:
    """The %NAME% expressions and the connection prefixes of these functions' bindings."""
    named: set[str] = set()
    connections: set[str] = set()
    for function in functions:
        for binding in function.bindings:
            named |= {m for value in binding.values() if isinstance(value, str) for m in re.findall(r"%(\w+)%", value)}
            connections |= {binding["connection"]} if binding.get("connection") else set()
    return named, connections


def assert_documented_and_deployed(named: set[str], connections: set[str]) -> None:
    """Each resolves from local.settings.json.example and from the app settings that
    infra/main.bicep deploys (a connection by managed identity, no key)."""
    bicep = (ROOT / "infra" / "main.bicep").read_text() + (ROOT / "infra/modules/functionapp.bicep").read_text()
    for name in named:
        assert name in DOCUMENTED, name
        assert re.search(rf"^\s*{name}:", bicep, re.MULTILINE), f"{name} is not an app setting in infra"
    for connection in connections:  # the service's address, as its extension reads it with an identity
        assert connection in DOCUMENTED, connection
        assert re.search(rf"^\s*{connection}__(fullyQualifiedNamespace|queueServiceUri|blobServiceUri):", bicep,
                         re.MULTILINE), connection  # fmt: skip


def test_every_setting_the_apps_bindings_name_is_documented_and_deployed(worker: WorkerHost) -> None:
    """Whatever consumers/ holds (the walkthrough's new consumer too): its bindings' settings
    are in local.settings.json.example and in what infra deploys."""
    app = declared_functions(consumers.modules(), consumers.needs())
    assert_documented_and_deployed(*settings_named(worker.functions[name] for name in app))


def test_without_dependency_isolation_the_workers_own_azure_functions_fails_indexing(
    runtime: build.Runtime, store_server: Azurite, table: str
) -> None:
    """Why PYTHON_ISOLATE_WORKER_DEPENDENCIES=1 is a documented setting (and set in infra): the
    worker bundles azure-functions 1.22, which has no func.CloudEvent. On 3.13+ the proxy always
    puts the app's packages first (the setting is not read): the app indexes."""
    settings = {**app_settings(store_server, table), "PYTHON_ISOLATE_WORKER_DEPENDENCIES": "0"}
    with WorkerHost(runtime, settings) as host:
        assert host.init().result.status == host.pb.StatusResult.Success
        indexed = host.index()
    if build.PROXY:
        assert indexed.result.status == host.pb.StatusResult.Success
        return
    assert indexed.result.status == host.pb.StatusResult.Failure
    assert "CloudEvent" in indexed.result.exception.message


def test_bad_settings_fail_the_start_with_every_problem_named(
    runtime: build.Runtime, store_server: Azurite, table: str
) -> None:
    """A DEDUP_RETENTION that is no duration and an unknown store: indexing fails with both in
    the host's log, so the host shows the functions in error instead of burning messages."""
    settings = {**app_settings(store_server, table), "DEDUP_RETENTION": "30 days", "DEDUP_STORE": "bogus"}
    with WorkerHost(runtime, settings) as host:
        indexed = host.init()  # azure-functions-runtime (3.13+) indexes the app in WorkerInitRequest
        if not build.PROXY:
            assert indexed.result.status == host.pb.StatusResult.Success
            indexed = host.index()
    assert indexed.result.status == host.pb.StatusResult.Failure
    message = indexed.result.exception.message
    assert "the app settings are not usable" in message and "DEDUP_RETENTION" in message and "bogus" in message


@pytest.mark.parametrize("start", ["placeholder", "direct"])
def test_the_deployed_telemetry_settings_configure_azure_monitor_exactly_once(
    runtime: build.Runtime, store_server: Azurite, table: str, start: str
) -> None:
    """The app settings infra deploys for OpenTelemetry. A Flex placeholder's specialisation:
    the worker configures the Azure Monitor distro from the app's packages and tells the host.
    A direct start (a worker restart): worker 4.34 cannot import the distro yet (dependency
    isolation), so the app does. Never both: a second configuration duplicates every record."""
    deployed = INFRA_APP.read_text()
    flags = {name: "true" for name in TELEMETRY_FLAGS if f"{name}: 'true'" in deployed}
    assert flags.keys() == set(TELEMETRY_FLAGS)
    nowhere = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=http://127.0.0.1:9/"
    settings = {**app_settings(store_server, table), **flags, "APPLICATIONINSIGHTS_CONNECTION_STRING": nowhere}
    placeholder = start == "placeholder"
    with WorkerHost(runtime, settings, placeholder=placeholder, hash_seed=SPECIALISES if placeholder else "") as host:
        host.start_app()
        item_id = new_id()
        assert deliver(host, "items", an_item(item_id), item_id) is None
        said = host.worker_output() + "\n".join(log.message for log in host.logs)
    by_worker = said.count("Successfully configured Azure monitor distro")
    by_app = said.count("Azure Monitor configured by the app")
    # 3.13+: azure-functions-runtime configures the distro itself at init, on either start
    assert (by_worker, by_app) == ((1, 0) if placeholder or build.PROXY else (0, 1))


# -- Service Bus ---------------------------------------------------------------------------------


def test_servicebus_queue_processes_once_and_dead_letters_what_it_refuses(
    worker: WorkerHost, store: TableStore
) -> None:
    item_id = new_id()
    assert deliver(worker, "items", an_item(item_id), item_id) is None
    assert deliver(worker, "items", an_item(item_id), item_id, delivery_count=2) is None  # redelivery
    assert (effects(store, item_id)["item"], effects(store, item_id)["posting"]) == (1, 1)

    assert deliver(worker, "items", an_item(item_id, amount=99), item_id) is None  # settled: a dead letter
    assert dead_letter_reasons(store, "items", item_id) == ["fingerprint_mismatch"]
    assert effects(store, item_id)["posting"] == 1

    broken = new_id()
    assert deliver(worker, "items", b'{"id": "x", ', broken) is None
    assert dead_letter_reasons(store, "items", broken) == ["invalid_json"]
    assert effects(store, broken)["item"] == 0


def test_what_the_consumer_records_keeps_the_brokers_sequence_number_for_the_audit(
    worker: WorkerHost, store: TableStore
) -> None:
    """The host's SequenceNumber and EnqueuedTimeUtc reach the consumer through the worker and
    are kept where it records each delivery: the marker, a duplicate's own record, the refusal's
    dead letter, a canary's marker (shared.idempotency.audit reads them back)."""
    item_id, broken, base = new_id(), new_id(), 2**50 + uuid.uuid4().int % 2**20
    enqueued = datetime.now(UTC).replace(microsecond=0)
    sent = {"sequence_number": base, "enqueued": enqueued}
    assert deliver(worker, "items", an_item(item_id), item_id, **sent) is None
    resent = {"sequence_number": base + 1, "enqueued": enqueued + timedelta(seconds=1)}
    assert deliver(worker, "items", an_item(item_id), item_id, **resent) is None  # past duplicate detection
    assert deliver(worker, "items", b"{", broken, sequence_number=base + 2, enqueued=enqueued) is None
    canary = {"sequence_number": base + 3, "enqueued": enqueued, "application_properties": {"dedup-canary": "t"}}
    assert deliver(worker, "items", b"{}", "dedup-canary-" + item_id, **canary) is None
    found = {
        (m.key.scope, m.sequence): m.enqueued_at  # the other transaction path's run shares the table
        for m in store.sequenced("items", enqueued - timedelta(seconds=1), enqueued + timedelta(seconds=2))
        if m.sequence is not None and base <= m.sequence <= base + 3
    }
    assert found == {("items", base): enqueued, ("items|seen", base + 1): enqueued + timedelta(seconds=1),
                     ("items|canary", base + 3): enqueued}  # fmt: skip
    [refused] = [d for d in store.dead_letters("items") if d.message_id == broken]
    assert (refused.sequence, refused.enqueued_at) == (base + 2, enqueued)
    assert effects(store, item_id)["item"] == 1 and effects(store, "dedup-canary-" + item_id) == Counter()


def test_a_body_field_cannot_replace_the_brokers_message_id(worker: WorkerHost, store: TableStore) -> None:
    """With a string body the host would merge "MessageId" from the JSON into the trigger
    metadata; the binary data type keeps the broker's MessageId as the key."""
    first, second = new_id(), new_id()
    assert deliver(worker, "items", an_item(first, MessageId="forged"), first) is None
    assert deliver(worker, "items", an_item(second, MessageId="forged"), second) is None
    # Each is applied under its own MessageId (its id: a key other than the id is refused as
    # key_mismatch, and would be dead-lettered under "forged").
    assert effects(store, first) == effects(store, second) == Counter({"item": 1, "posting": 1})
    assert dead_letter_reasons(store, "items", first) == dead_letter_reasons(store, "items", second) == []
    assert dead_letter_reasons(store, "items", "forged") == []


def test_a_queue_consumer_and_a_topic_subscriber_each_apply_the_message_once(
    worker: WorkerHost, store: TableStore
) -> None:
    """One message to two consumers (a queue's, a topic subscription's): each applies it once,
    in partitions of its own. The subscriber keys by the body's id: a re-send under another
    MessageId is a duplicate to it."""
    item_id = new_id()
    for resent in (item_id, uuid.uuid4().hex):
        assert deliver(worker, "items", an_item(item_id), item_id, subject="item.recorded") is None
        assert deliver(worker, "item_subscriber", an_item(item_id), resent, subject="item.recorded") is None
    for consumer in ("items", "item-subscriber"):
        assert effects(store, item_id, consumer) == Counter({"item": 1, "posting": 1}), consumer


def test_batch_with_cardinality_many_commits_once_and_replays_from_the_cache(
    worker: WorkerHost, store: TableStore
) -> None:
    batch = new_id()
    messages = [ServiceBusMessage(an_item(f"{batch}-{i}", i + 1), f"{batch}-{i}", sequence_number=i)
                for i in range(3)]  # fmt: skip
    messages.append(ServiceBusMessage(b"not json", f"{batch}-bad", sequence_number=3))
    trigger = worker.trigger("item_batch")
    assert worker.failed(worker.invoke("item_batch", servicebus_batch(trigger, messages))) is None
    logged = len(worker.logs)
    assert worker.failed(worker.invoke("item_batch", servicebus_batch(trigger, messages))) is None  # the replay
    found = {key: n for key, n in effects_by_item(store).items() if key.startswith(f"{batch}-")}
    assert found == {f"{batch}-{i}": Counter({"item": 1, "posting": 1}) for i in range(3)}
    assert dead_letter_reasons(store, "item-batch", f"{batch}-bad") == ["invalid_json"]
    replay = [log.message for log in worker.logs[logged:] if log.category == "idempotency"]
    assert len(replay) == 4
    assert sum("reason='completed_recently'" in line for line in replay) == 3  # no store request


# -- Event Grid, HTTP, timers --------------------------------------------------------------------


def shipped(event_id: str, item_id: str, tracking: str = "T-1") -> dict[str, Any]:
    return {"specversion": "1.0", "id": event_id, "source": "/warehouse/eu", "type": EVENT_TYPE,
            "subject": f"items/{item_id}", "time": "2026-11-30T10:00:00Z",
            "data": {"id": item_id, "carrier": "DHL", "trackingNumber": tracking}}  # fmt: skip


def shipments(store: TableStore, item_id: str) -> int:
    return sum(found.entity == "shipment" for found in store.scan() if found.data.get("itemId") == item_id)


def test_event_grid_cloudevent_applies_once(worker: WorkerHost, store: TableStore) -> None:
    event_id, item_id = uuid.uuid4().hex, new_id()
    trigger = worker.trigger("item_events")
    for _ in range(2):
        assert worker.failed(worker.invoke("item_events", cloudevent(trigger, shipped(event_id, item_id)))) is None
    assert shipments(store, item_id) == 1
    other = cloudevent(trigger, shipped(event_id, item_id, tracking="T-2"))
    assert worker.failed(worker.invoke("item_events", other)) is None  # accepted: recorded as a dead letter
    assert shipments(store, item_id) == 1


def test_a_storage_queue_message_applies_once_and_an_invalid_one_is_refused_at_its_first_dequeue(
    worker: WorkerHost, store: TableStore
) -> None:
    """on_storage_queue with the trigger data the host sends (DequeueCount, Id, PopReceipt,
    InsertionTime, NextVisibleTime): a message dequeued again and a producer's retry (a new
    message id) apply the item once; an invalid one is dead-lettered with its dequeue count."""
    trigger, item_id = worker.trigger("item_queue"), new_id()
    body = an_item(item_id)
    for message in (StorageQueueMessage(body, 1, item_id), StorageQueueMessage(body, 2, item_id),
                    StorageQueueMessage(body)):  # fmt: skip
        assert worker.failed(worker.invoke("item_queue", storage_queue(trigger, message))) is None
    assert effects_by_item(store, item_id, "item-queue") == {item_id: Counter({"item": 1, "posting": 1})}
    bad = StorageQueueMessage(json.dumps({"id": item_id + "-bad", "amount": -1}).encode(), 1, item_id + "-bad")
    assert worker.failed(worker.invoke("item_queue", storage_queue(trigger, bad))) is None
    [record] = [d for d in store.dead_letters("item-queue") if d.message_id == item_id + "-bad"]
    assert (record.reason, record.delivery_count) == ("schema_violation", 1)


def test_a_blob_import_applies_each_record_once_and_refuses_a_malformed_file_whole(
    worker: WorkerHost, store: TableStore
) -> None:
    """on_blob_import with the trigger data the host sends (the content as bytes, BlobTrigger,
    Uri, Properties with LastModified, Metadata): the same upload run twice applies each record
    once; a malformed file is dead-lettered whole with its line, and acknowledged."""
    trigger, name = worker.trigger("item_import"), f"items-{uuid.uuid4().hex[:8]}.jsonl"
    content = b"".join(an_item(f"{name}-{n}") + b"\n" for n in range(20))
    for _ in range(2):  # the BlobCreated event twice
        assert worker.failed(worker.invoke("item_import", blob(trigger, Blob("item-imports", name, content)))) is None
    file = consumer_partition("item-imports", f"item-imports/{name}")
    assert sorted(e.data["itemId"] for e in store.read_entities(file, "", 1000) if "itemId" in e.data) == sorted(
        f"{name}-{n}" for n in range(20))  # fmt: skip
    bad = Blob("item-imports", "bad-" + name, content[:-10])
    assert worker.failed(worker.invoke("item_import", blob(trigger, bad))) is None
    [record] = [d for d in store.dead_letters("item-imports") if d.key_id == f"item-imports/bad-{name}"]
    assert record.reason == "file_malformed" and record.detail.startswith("line 20:")


def post(worker: WorkerHost, function: str, path: str, body: bytes, **headers: str) -> tuple[int, dict[str, str], Any]:
    request = Http("POST", path, {"Content-Type": "application/json", "x-functions-key": FUNCTION_KEY, **headers}, body)
    response = worker.invoke(function, http(worker.trigger(function), request))
    assert worker.failed(response) is None
    status, response_headers, raw = http_result(worker.pb, response)
    return status, response_headers, json.loads(raw) if raw else None


def test_http_items_route_replays_refuses_and_validates(worker: WorkerHost, store: TableStore) -> None:
    item_id, key = new_id(), uuid.uuid4().hex
    status, headers, body = post(worker, "items_api", "/api/items", an_item(item_id), **{"Idempotency-Key": key})
    assert (status, headers["Location"], body["id"]) == (201, f"/api/items/{item_id}", item_id)
    status, headers, again = post(worker, "items_api", "/api/items", an_item(item_id), **{"Idempotency-Key": key})
    assert (status, headers.get("Idempotent-Replayed"), again) == (201, "true", body)
    status, headers, _ = post(
        worker, "items_api", "/api/items", an_item(item_id, 1), **{"Idempotency-Key": f"k3-{item_id}"}
    )
    assert status == 409 and headers["content-type"] == "application/problem+json"  # the id taken, other payload
    status, headers, _ = post(worker, "items_api", "/api/items", an_item(item_id, 1), **{"Idempotency-Key": key})
    assert status == 422 and headers["content-type"] == "application/problem+json"  # the key reused, other payload
    status, headers, again_new_key = post(
        worker, "items_api", "/api/items", an_item(item_id), **{"Idempotency-Key": uuid.uuid4().hex}
    )
    assert (status, headers.get("Idempotent-Replayed"), again_new_key) == (201, "true", body)  # a new key replays
    assert post(worker, "items_api", "/api/items", an_item(new_id()))[0] == 400  # no Idempotency-Key
    assert post(worker, "items_api", "/api/items", b"{", **{"Idempotency-Key": uuid.uuid4().hex})[0] == 400
    assert effects(store, item_id, "items-api")["posting"] == 1


def test_http_events_route_accepts_a_cloudevent_once_and_answers_the_handshake(
    worker: WorkerHost, store: TableStore
) -> None:
    event_id, item_id = uuid.uuid4().hex, new_id()
    body = json.dumps(shipped(event_id, item_id)).encode()
    headers = {"Content-Type": "application/cloudevents+json"}
    assert post(worker, "item_events_api", "/api/item-events", body, **headers)[0] == 204
    status, replayed, _ = post(worker, "item_events_api", "/api/item-events", body, **headers)
    assert (status, replayed.get("Idempotent-Replayed")) == (204, "true")
    assert shipments(store, item_id) == 1
    handshake = Http("OPTIONS", "/api/item-events", {"WebHook-Request-Origin": "eventgrid.azure.net"})
    response = worker.invoke("item_events_api", http(worker.trigger("item_events_api"), handshake))
    status, answer, _ = http_result(worker.pb, response)
    assert (status, answer["WebHook-Allowed-Origin"], answer["Allow"]) == (200, "eventgrid.azure.net", "POST")


@pytest.fixture(scope="module")
def every_timer(runtime: build.Runtime, store_server: Azurite, table: str) -> Iterator[WorkerHost]:
    """The app with the library tests' two-phase payments and outbox switched on (their
    settings): every housekeeping timer is registered. Only the timers are invoked here."""
    with tempfile.TemporaryDirectory(prefix="runtime-timers-") as folder:
        settings = {**app_settings(store_server, table), "ITEMS_PAYMENT_URL": "http://127.0.0.1:9/",
                    "ITEMS_TOPIC": "items", "DEDUP_SENDER": "file",
                    "DEDUP_SENDER_FILE": str(Path(folder) / "sent.jsonl")}  # fmt: skip
        with WorkerHost(runtime, settings) as host:
            yield host.start_app()


@pytest.mark.parametrize("function", ["reconcile_claims", "purge_markers", "sweep_markers", "dispatch_outbox"])
def test_timers_run(every_timer: WorkerHost, function: str) -> None:
    assert set(every_timer.functions) == declared_functions(needs=["steps", "outbox"])
    for past_due in (False, True):
        trigger = timer(every_timer.trigger(function), past_due=past_due)
        assert every_timer.failed(every_timer.invoke(function, trigger)) is None


def test_a_scheduled_job_handles_each_item_once_per_occurrence(worker: WorkerHost, store: TableStore) -> None:
    """The timer fires, then fires again past due (a restart): one reminder per item."""
    for past_due in (False, True):
        trigger = timer(worker.trigger("item_job"), past_due=past_due)
        assert worker.failed(worker.invoke("item_job", trigger)) is None
    when = f"{occurrence(datetime.now(UTC), timedelta(days=1), timedelta(hours=6)):%Y-%m-%dT%H:%M:%SZ}"
    found = Counter(found.data["itemId"] for found in store.scan()
                    if found.entity == "reminder" and found.data["occurrence"] == when)  # fmt: skip
    assert found == Counter({f"i-{i}": 1 for i in range(5)})


def tracking_by_event(store: TableStore) -> Counter[str]:
    """How many tracking records each event key has (the stream's ground truth)."""
    return Counter(str(found.data["eventKey"]) for found in store.scan()
                   if str(found.entity).startswith("tracking|"))  # fmt: skip


def test_an_event_hubs_batch_applies_each_event_once_across_replays(worker: WorkerHost, store: TableStore) -> None:
    """Keys: the producer's id (a retry of it, a new event with a new sequence number, is a
    duplicate), else hub/partition/sequence number@enqueued time (a replay from the checkpoint is); an
    invalid event is dead-lettered and never stops the partition."""
    stream = new_id()
    first = item(stream, 1.0, status="picked")
    second = item(stream, 1.0, status="shipped")
    batch = [HubEvent(json.dumps(first).encode(), 10, {"message_id": f"{stream}-1"}),
             HubEvent(json.dumps(first).encode(), 11, {"message_id": f"{stream}-1"}),  # the producer's retry
             HubEvent(json.dumps(second).encode(), 12),  # no producer id: its position
             HubEvent(b"not json", 13)]  # fmt: skip
    trigger = worker.trigger("item_stream")
    for _ in range(2):  # the second time: a replay from the last checkpoint (a restart, a rebalance)
        response = worker.invoke("item_stream", eventhub_batch(trigger, batch, hub="items"), retry=(0, 5))
        assert worker.failed(response) is None
    second_key, invalid_key = (position(event) for event in batch[2:])
    found = {key: n for key, n in tracking_by_event(store).items() if key in (f"{stream}-1", second_key)}
    assert found == {f"{stream}-1": 1, second_key: 1}
    assert dead_letter_reasons(store, "item-stream", invalid_key) == ["invalid_json"]


def position(event: HubEvent, partition: str = "items/0") -> str:
    """The key of an event without a producer id: its place in the hub and its enqueued time
    (sequence numbers start again in a re-created hub; a replay keeps both)."""
    enqueued = event.enqueued.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    return f"{partition}/{event.sequence_number}@{enqueued}Z"


def test_a_session_message_applies_its_item_state_in_version_order(worker: WorkerHost, store: TableStore) -> None:
    """item_state on a session queue (SessionId = the item's id, the host's binding data): each
    version applied once, a redelivery a duplicate, an older version after a newer stale."""
    item_id = new_id()

    def change(version: int, status: str, count: int = 1) -> str | None:
        body = json.dumps({"id": item_id, "status": status, "version": version}).encode()
        message = ServiceBusMessage(body, f"{item_id}:{version}", delivery_count=count, session_id=item_id)
        return worker.failed(worker.invoke("item_state", servicebus(worker.trigger("item_state"), message)))

    assert [change(1, "placed"), change(2, "paid"), change(2, "paid", count=2), change(1, "placed", 2)] == [None] * 4
    [state] = [i.data for i in store.scan(consumer_partition("item-state", item_id)) if i.entity == "state"]
    assert (state["status"], getattr(state["StateVersion"], "value", state["StateVersion"])) == ("paid", 2)


# -- the outbox: a function that commits and sends -------------------------------------------------


@pytest.fixture(scope="module")
def sent(runtime: build.Runtime, store_server: Azurite, table: str) -> Iterator[tuple[WorkerHost, Path]]:
    """The items consumer publishing each item (ITEMS_TOPIC), its sender writing what it sends
    to a file (DEDUP_SENDER=file): the worker's own process commits and sends."""
    with tempfile.TemporaryDirectory(prefix="runtime-outbox-") as folder:
        outbox = Path(folder) / "sent.jsonl"
        settings = {**app_settings(store_server, table), "ITEMS_TOPIC": "items", "DEDUP_SENDER": "file",
                    "DEDUP_SENDER_FILE": str(outbox)}  # fmt: skip
        with WorkerHost(runtime, settings) as host:
            yield host.start_app(), outbox


def test_an_item_is_committed_then_published_once_through_the_worker(
    sent: tuple[WorkerHost, Path], store: TableStore
) -> None:
    worker, outbox = sent
    item_id = new_id()
    for count in (1, 2):  # the second: a redelivery after a lost completion
        assert deliver(worker, "items", an_item(item_id), item_id, delivery_count=count) is None
    lines = [json.loads(line) for line in outbox.read_text().splitlines()]
    mine = [line for line in lines if line["body"]["id"] == item_id]
    expected_id = message_id(DedupKey("items", item_id), "published")
    assert [(m["destination"], m["messageId"], m["properties"]) for m in mine] == [
        ("items", expected_id, {"type": "ItemRecorded"})]  # fmt: skip
    assert effects(store, item_id)["item"] == 1
    assert store.read_entities(consumer_partition("items", item_id), ROWS, 10) == []  # sent, then deleted
    assert worker.failed(worker.invoke("dispatch_outbox", timer(worker.trigger("dispatch_outbox")))) is None


# -- failures the host must see ------------------------------------------------------------------


def test_store_down_fails_the_invocation_so_the_host_abandons(
    worker: WorkerHost, store_server: Azurite, store: TableStore
) -> None:
    item_id = new_id()
    store_server.stop()
    try:
        failure = deliver(worker, "items", an_item(item_id), item_id)
    finally:
        store_server.start()
    assert failure is not None and "transient" in failure
    assert deliver(worker, "items", an_item(item_id), item_id, delivery_count=2) is None  # the redelivery
    assert effects(store, item_id)["posting"] == 1


# Worker 4.34 specialises a placeholder with dependency isolation only for some orders of its
# module cache: clearing it can drop the ``azurefunctions`` namespace package before its
# ``azurefunctions.extensions`` child, and load_binding_registry then fails with KeyError.
# The order follows the worker process's string hashing, so these tests fix PYTHONHASHSEED.
SPECIALISES, FAILS = "2", "0"


def test_a_flex_consumption_placeholder_specialises_into_the_app(
    runtime: build.Runtime, store_server: Azurite, table: str, store: TableStore
) -> None:
    """Flex/Linux Consumption start: the worker starts as a placeholder (CONTAINER_NAME,
    WEBSITE_PLACEHOLDER_MODE=1) before the app is mounted at /home/site/wwwroot, and becomes
    the app through FunctionEnvironmentReloadRequest."""
    settings = app_settings(store_server, table)
    with WorkerHost(runtime, settings, placeholder=True, hash_seed=SPECIALISES) as host:
        host.start_app()
        assert set(host.functions) == declared_functions()  # whatever consumers the app has
        item_id = new_id()
        assert deliver(host, "items", an_item(item_id), item_id) is None
    assert effects(store, item_id)["item"] == 1


def test_the_worker_4_34_placeholder_defect_is_still_there(
    runtime: build.Runtime, store_server: Azurite, table: str
) -> None:
    """The platform limitation docs/reliability.md states; when a newer worker fixes it, this
    fails and the note goes. azure-functions-runtime (3.13+) specialises with the same seed."""
    with WorkerHost(runtime, app_settings(store_server, table), placeholder=True, hash_seed=FAILS) as host:
        host.init()
        reloaded = host.specialize()
    if build.PROXY:
        assert reloaded.result.status == host.pb.StatusResult.Success, host.exception(reloaded)
        return
    assert reloaded.result.status == host.pb.StatusResult.Failure
    assert "KeyError: 'azurefunctions'" in host.exception(reloaded)


def test_the_chaos_harness_delivers_through_the_worker(runtime: build.Runtime, store_server: Azurite) -> None:
    """CHAOS_RUNTIME=worker on the library tests' items: competing deliveries, duplicates,
    lost acknowledgements and a store outage, through the worker; the checker reads Azurite."""
    config = RunConfig(messages=60, workers=4, dup_rate=0.4, fault_rate=0.05, seed=20261130, outage=True,
                       table="rt" + uuid.uuid4().hex[:12], runtime="worker")  # fmt: skip
    report = run(config, store_server, ITEMS)
    assert report.violations == []
    assert (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.effects_applied == report.messages - report.dead_lettered
    assert report.outcomes["processed"] == report.effects_applied  # counted from the worker's own log lines
    assert report.outcomes["duplicate"] > 0 and report.broker_dead_lettered == 0  # the outage, waited out
    assert report.store_restarts == 1 and set(report.faults) <= {"crash_before_ack", "lost_ack"}
