"""The canary through every Service Bus entity an app reads, and its heartbeat alert evaluated as
Azure Monitor evaluates it: the template's own log records, exported by the Azure Monitor
OpenTelemetry exporter to a local ingestion endpoint, become the rows of ``traces``; the alert's
query text, read from infra/modules/alerts.bicep, runs on them in a KQL engine (duckdb-kql).
Time is the one thing simulated: each timer tick's records are placed one interval after the
previous tick's."""

from __future__ import annotations

import gzip
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import duckdb_kql
import pytest

from shared.idempotency import Effects, Entity, IdempotentConsumer, canary
from shared.idempotency.canary import INTERVAL
from shared.idempotency.functions import _housekeeping as timers
from shared.idempotency.functions import housekeeping, on_eventgrid, on_servicebus
from shared.idempotency.stores import MemoryStore
from shared.idempotency.testing import servicebus_message
from shared.idempotency.testing.broker import PeekLockQueue

ALERTS = Path(__file__).resolve().parents[2] / "infra" / "modules" / "alerts.bicep"


def heartbeat_rule() -> tuple[str, timedelta]:
    """The alert's query text, and the time range it reads (overrideQueryTimeRange)."""
    text = ALERTS.read_text()
    query = re.search(r"var canaryHeartbeatQuery = '''\n(.*?)'''", text, re.S)
    lookback = re.search(r"resource canaryHeartbeat .*?overrideQueryTimeRange: 'P(\d+)D'", text, re.S)
    assert query and lookback, "alerts.bicep: the heartbeat rule's query or time range moved: update this test"
    return query.group(1), timedelta(days=int(lookback.group(1)))


class Ingestion(BaseHTTPRequestHandler):
    """Application Insights' ingestion endpoint (``/v2.1/track``): keeps what it is sent."""

    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        items = json.loads(body)
        self.received.extend(items if isinstance(items, list) else [items])
        answer = json.dumps({"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The ``idempotency`` logger's records at INFO, as Application Insights receives them."""
    from azure.monitor.opentelemetry.exporter import AzureMonitorLogExporter
    from opentelemetry.instrumentation.logging.handler import LoggingHandler  # the distro's, on Azure
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    monkeypatch.setenv("APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL", "true")  # no calls home
    monkeypatch.setenv("APPLICATIONINSIGHTS_SDKSTATS_DISABLED", "true")  # nor its own counts, to the endpoint
    received: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Track", (Ingestion,), {"received": received}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = AzureMonitorLogExporter(
        connection_string="InstrumentationKey=00000000-0000-0000-0000-000000000000;"
        f"IngestionEndpoint=http://127.0.0.1:{server.server_port}/",
        disable_offline_storage=True,
    )
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))  # exported as logged: no waiting
    handler = LoggingHandler(level=logging.INFO, logger_provider=provider)
    logger = logging.getLogger("idempotency")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield received
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        provider.shutdown()
        server.shutdown()


class ToTheModel:
    """The Service Bus client's senders the canary timer opens, onto the broker model's queues."""

    def __init__(self, queues: dict[str, PeekLockQueue]) -> None:
        self.queues = queues

    def __enter__(self) -> ToTheModel:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def get_queue_sender(self, queue_name: str) -> Any:
        queue = self.queues[queue_name]

        class Sender:
            def __enter__(self) -> Sender:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def send_messages(self, message: Any) -> None:
                properties = {str(k): str(v) for k, v in (message.application_properties or {}).items()}
                queue.send(message.message_id, b"".join(message.body), properties)

        return Sender()


class ToTheTopic:
    """Event Grid's side: what the canary timer publishes, pushed to the app's Event Grid function."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def send(self, entity: Any, message_id: str, properties: dict[str, str]) -> None:
        from azure.core.messaging import CloudEvent

        from shared.idempotency.facts import CANARY_PROPERTY, CANARY_SOURCE, CANARY_TYPE

        self.events.append(CloudEvent(source=CANARY_SOURCE, type=CANARY_TYPE, id=message_id,
                                      data={"entity": properties[CANARY_PROPERTY]}))  # fmt: skip


TOPIC = "https://shipments.westeurope-1.eventgrid.azure.net/api/events"


class App:
    """An app of two Service Bus consumers (queues named by app settings, as a user writes
    them) and an Event Grid one, and the timers ``housekeeping`` registers for them, indexed as
    the worker does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queues = {name: PeekLockQueue(30.0, 10, 1000) for name in ("invoices", "refunds")}
        bp = func.Blueprint()  # type: ignore[no-untyped-call]
        store = MemoryStore()
        for name in self.queues:
            monkeypatch.setenv(f"{name.upper()}_QUEUE", name)
            flow = IdempotentConsumer(name, store, lambda payload, context: Effects([Entity("e", {})]))
            self._trigger(bp, name, flow)
        shipped = IdempotentConsumer("shipped", store, lambda payload, context: Effects([Entity("e", {})]))

        @bp.function_name("shipped")
        @bp.event_grid_trigger(arg_name="event")
        def on_event(event: func.CloudEvent) -> None:
            on_eventgrid(lambda: shipped, event)

        monkeypatch.setenv("EVENTGRID_TOPIC_ENDPOINT", TOPIC)
        self.topic = ToTheTopic()
        monkeypatch.setattr(canary, "EventGridCanaries", lambda: self.topic)
        app = func.FunctionApp()
        for blueprint in [bp, *housekeeping(watched=[bp])]:
            app.register_functions(blueprint)
        self.functions: dict[str, Callable[..., Any]] = {
            str(fn.get_function_name()): fn.get_user_function() for fn in app.get_functions()
        }
        monkeypatch.setattr(timers, "servicebus_client", lambda who: ToTheModel(self.queues))

    @staticmethod
    def _trigger(bp: func.Blueprint, name: str, flow: IdempotentConsumer) -> None:
        @bp.function_name(name)
        @bp.service_bus_queue_trigger(arg_name="msg", queue_name=f"%{name.upper()}_QUEUE%",
                                      connection="ServiceBusConnection")  # fmt: skip
        def receive(msg: func.ServiceBusMessage) -> None:
            on_servicebus(lambda: flow, msg)

    def tick(self) -> None:
        self.functions["send_canaries"](SimpleNamespace(past_due=False))

    def drain(self, name: str) -> None:
        if name == "shipped":
            events, self.topic.events = self.topic.events, []
            for e in events:
                self.functions["shipped"](func.CloudEvent(source=e.source, type=e.type, id=e.id, data=e.data,
                                                          specversion="1.0"))  # fmt: skip
            return
        queue = self.queues[name]
        while (lock := queue.receive(0)) is not None:
            m = lock.message
            self.functions[name](servicebus_message(m.body, m.message_id, delivery_count=lock.delivery_count,
                                                    sequence_number=m.seq, enqueued_time=m.enqueued_at,
                                                    properties=m.properties))  # fmt: skip
            assert queue.complete(lock)


def alert_value(received: list[dict[str, Any]], rounds: list[int], evaluated_at: int) -> int:
    """The heartbeat query's ``value`` when the rule runs half an interval after tick
    ``evaluated_at``: each record placed at its tick, on the rule's time range."""
    query, lookback = heartbeat_rule()
    now = datetime.now(UTC)
    con = duckdb_kql.connect()
    con.sql("CREATE TABLE traces (timestamp TIMESTAMPTZ, message VARCHAR, severityLevel INTEGER, "
            "customDimensions JSON)")  # fmt: skip
    for envelope, tick in zip(received, rounds, strict=True):
        if envelope["name"] != "Microsoft.ApplicationInsights.Message" or tick > evaluated_at:
            continue
        at = now - (evaluated_at - tick) * INTERVAL - INTERVAL / 2
        if at > now - lookback:
            data = envelope["data"]["baseData"]
            con.execute("INSERT INTO traces VALUES (?, ?, ?, ?)",
                        [at, data["message"], data.get("severityLevel"), json.dumps(data["properties"])])  # fmt: skip
    [(value,)] = duckdb_kql.kql(con, query).fetchall()
    return int(value)


def run(app: App, exported: list[dict[str, Any]], ticks: int, sends: Callable[[int], bool],
        running: Callable[[int], set[str]]) -> list[int]:  # fmt: skip
    """``ticks`` timer intervals: the timer sends when ``sends(tick)``, then the consumers
    ``running(tick)`` take their queue's messages; the alert's value after each tick."""
    rounds = [0] * len(exported)  # what the app logged as it started (the audit's WARNINGs), with the first tick
    for tick in range(ticks):
        before = len(exported)
        if sends(tick):
            app.tick()
        for name in running(tick):
            app.drain(name)
        rounds += [tick] * (len(exported) - before)
    return [alert_value(exported, rounds, tick) for tick in range(ticks)]


ENTITIES = {"invoices": "invoices", "refunds": "refunds", "shipped": TOPIC}  # consumer: what it reads
ALL = set(ENTITIES)


@pytest.mark.parametrize("stopped", ["refunds", "shipped"])
def test_a_stopped_consumer_raises_the_heartbeat_alert_within_two_intervals(
    stopped: str, monkeypatch: pytest.MonkeyPatch, exported: list[dict[str, Any]]
) -> None:
    """A consumer (of a queue, of the Event Grid topic) stops after tick 2: its last heartbeat
    is 2.5 intervals old at tick 4's evaluation, the first to fire; the others never raise it."""
    app = App(monkeypatch)
    values = run(app, exported, 7, lambda tick: True, lambda tick: ALL if tick <= 2 else ALL - {stopped})
    assert values == [0, 0, 0, 0, 1, 1, 1]


def test_the_alert_fires_for_each_entity_whose_canaries_nobody_ever_saw(
    monkeypatch: pytest.MonkeyPatch, exported: list[dict[str, Any]]
) -> None:
    app = App(monkeypatch)
    assert run(app, exported, 4, lambda tick: True, lambda tick: {"invoices"}) == [0, 0, 2, 2]
    assert len(app.queues["refunds"]._ready) == 4  # the canaries nobody took


def test_the_alert_fires_for_every_entity_when_the_canaries_stop_being_sent(
    monkeypatch: pytest.MonkeyPatch, exported: list[dict[str, Any]]
) -> None:
    """The app down (its timer with it): the heartbeats stop everywhere."""
    app = App(monkeypatch)
    assert run(app, exported, 6, lambda tick: tick <= 1, lambda tick: ALL) == [0, 0, 0, 3, 3, 3]


def test_each_canary_is_one_message_and_its_heartbeat_names_the_entity_and_consumer(
    monkeypatch: pytest.MonkeyPatch, exported: list[dict[str, Any]]
) -> None:
    app = App(monkeypatch)
    app.tick()
    app.tick()
    for name in ALL:
        app.drain(name)
    assert [app.queues[name].accepted for name in ("invoices", "refunds")] == [2, 2]  # one per tick and entity
    dimensions = [e["data"]["baseData"]["properties"] for e in exported]
    events = [(d["dedup_event"], d.get("dedup_entity"), d.get("dedup_consumer"))
              for d in dimensions if "dedup_event" in d]  # fmt: skip
    sent = [("canary.sent", entity, None) for entity in ENTITIES.values()]
    seen = [("canary.seen", entity, name) for name, entity in ENTITIES.items()]
    assert sorted(events) == sorted((sent + seen) * 2)


def test_an_unset_setting_stops_only_its_entitys_canary(
    monkeypatch: pytest.MonkeyPatch, exported: list[dict[str, Any]]
) -> None:
    """EVENTGRID_TOPIC_ENDPOINT missing: the queues still get theirs; the run fails, saying which."""
    from shared.idempotency.errors import ConfigurationError

    app = App(monkeypatch)
    monkeypatch.delenv("EVENTGRID_TOPIC_ENDPOINT")
    with pytest.raises(ConfigurationError, match="EVENTGRID_TOPIC_ENDPOINT"):
        app.tick()
    assert [app.queues[name].accepted for name in ("invoices", "refunds")] == [1, 1] and not app.topic.events


def test_the_timer_the_alert_and_the_module_agree_on_the_interval() -> None:
    query, _ = heartbeat_rule()
    [minutes] = re.findall(r"let interval = (\d+)m;", query)
    assert timedelta(minutes=int(minutes)) == INTERVAL
    [timer] = [fn for fn in _indexed(housekeeping(watched=[_one_queue()])) if fn.get_function_name() == "send_canaries"]
    schedule = timer.get_trigger().get_dict_repr()["schedule"]
    assert schedule == f"0 */{int(INTERVAL.total_seconds() // 60)} * * * *"


def _one_queue() -> func.Blueprint:
    bp = func.Blueprint()  # type: ignore[no-untyped-call]

    @bp.service_bus_queue_trigger(arg_name="msg", queue_name="q", connection="ServiceBusConnection")
    def q(msg: func.ServiceBusMessage) -> None: ...

    return bp


def _indexed(blueprints: list[func.Blueprint]) -> list[Any]:
    app = func.FunctionApp()
    for blueprint in blueprints:
        app.register_functions(blueprint)
    return list(app.get_functions())


def test_the_canary_goes_through_each_entity_the_triggers_read_and_only_with_a_broker_trigger() -> None:
    from shared.idempotency.canary import Entity as Through

    bp = func.Blueprint()  # type: ignore[no-untyped-call]

    @bp.service_bus_queue_trigger(arg_name="msg", queue_name="%A_QUEUE%", connection="ServiceBusConnection")
    def a(msg: func.ServiceBusMessage) -> None: ...

    @bp.service_bus_topic_trigger(arg_name="msg", topic_name="t", subscription_name="one",
                                  connection="ServiceBusConnection")  # fmt: skip
    def b(msg: func.ServiceBusMessage) -> None: ...

    @bp.service_bus_topic_trigger(arg_name="msg", topic_name="t", subscription_name="two",
                                  connection="ServiceBusConnection")  # fmt: skip
    def c(msg: func.ServiceBusMessage) -> None: ...

    @bp.service_bus_queue_trigger(arg_name="msg", queue_name="s", connection="ServiceBusConnection",
                                  is_sessions_enabled=True)  # fmt: skip
    def d(msg: func.ServiceBusMessage) -> None: ...

    @bp.event_grid_trigger(arg_name="event")
    def e(event: func.CloudEvent) -> None: ...

    @bp.event_grid_trigger(arg_name="event")
    def f(event: func.CloudEvent) -> None: ...

    assert timers.watched_entities([bp]) == [Through("queue", "%A_QUEUE%"), Through("topic", "t"),
                                             Through("queue", "s", sessions=True),
                                             Through("eventgrid", "%EVENTGRID_TOPIC_ENDPOINT%")]  # fmt: skip
    names = {fn.get_function_name() for fn in _indexed([bp, *housekeeping(watched=[bp])])}
    assert {"send_canaries", "audit_consumers"} <= names
    assert not {"send_canaries", "audit_consumers"} & {fn.get_function_name() for fn in _indexed(housekeeping())}


def test_only_a_cloudevent_of_the_canarys_type_source_and_id_is_a_canary() -> None:
    """An Event Grid event is a canary only as the timer sends it: a business event sharing one
    of those runs its handler."""
    from shared.idempotency.facts import CANARY_SOURCE, CANARY_TYPE, is_canary
    from shared.idempotency.functions.adapters import eventgrid_delivery

    def event(**changed: str) -> func.CloudEvent:
        fields = {"source": CANARY_SOURCE, "type": CANARY_TYPE, "id": "dedup-canary-1", **changed}
        return func.CloudEvent(data={"entity": "t"}, specversion="1.0", **fields)

    assert is_canary(eventgrid_delivery(event()))
    for odd in ({"id": "order-1"}, {"source": "/shop"}, {"type": "com.example.order.shipped"}):
        assert not is_canary(eventgrid_delivery(event(**odd))), odd


def test_an_outcomes_fields_reach_application_insights_each_as_a_dimension(exported: list[dict[str, Any]]) -> None:
    """What an operator's query reads (customDimensions.dedup_outcome, …), as the exporter sends it."""
    flow = IdempotentConsumer("items", MemoryStore(), lambda payload, context: Effects([Entity("e", payload)]))
    from shared.idempotency import Delivery

    flow.process(Delivery(b'{"v": 1}', message_id="k-1", correlation_id="c-1"))
    flow.process(Delivery(b'{"v": 2}', message_id="k-1", correlation_id="c-2"))  # the same key, another payload
    [conflict] = [e["data"]["baseData"]["properties"] for e in exported if "dedup_outcome" in e["data"]["baseData"][
        "properties"]]  # fmt: skip
    assert {name: conflict[name] for name in ("dedup_consumer", "dedup_outcome", "dedup_key", "dedup_correlation_id",
                                              "dedup_reason")} == {
        "dedup_consumer": "items", "dedup_outcome": "conflict", "dedup_key": "k-1", "dedup_correlation_id": "c-2",
        "dedup_reason": "fingerprint_mismatch"}  # fmt: skip
    assert "dedup" not in conflict  # no dict flattened to one string
