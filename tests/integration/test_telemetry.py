"""Telemetry through an in-memory OpenTelemetry SDK: counts and attributes asserted."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.idempotency import Context, Delivery, Effects, Entity, IdempotentConsumer, Outcome, Outgoing
from shared.idempotency.config import DedupConfig
from shared.idempotency.errors import DownstreamUnavailable
from shared.idempotency.functions import shared_store
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import MemoryStore
from shared.idempotency.testing import flush_expiry_notes
from shared.idempotency.testing.azurite import Azurite
from tests.app import item
from tests.conftest import new_table_store
from tests.functions import fresh_app, servicebus_message, user_function

READER = InMemoryMetricReader()
SPANS = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def sdk() -> None:
    """The global providers can be set once per process; the app's instruments, created
    through the API before that, start recording into them."""
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SPANS))
    trace.set_tracer_provider(provider)


def points() -> dict[tuple[str, tuple[tuple[str, Any], ...]], Any]:
    found: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    found[(metric.name, tuple(sorted(point.attributes.items())))] = (
                        value if value is not None else point.count  # type: ignore[attr-defined]
                    )
    return found


def delta(before: dict[Any, Any], after: dict[Any, Any], name: str, **attributes: Any) -> Any:
    """How much ``name`` grew on the points whose attributes include these: what a query
    filtering on them sums (an outcome's points of every reason, say)."""
    wanted = set(attributes.items())

    def summed(snapshot: dict[Any, Any]) -> Any:
        return sum(value for (metric, pairs), value in snapshot.items() if metric == name and wanted <= set(pairs))

    return summed(after) - summed(before)


def total(snapshot: dict[Any, Any], name: str) -> int:
    return int(sum(value for (metric, _), value in snapshot.items() if metric == name))


@pytest.fixture(params=["0", "10000"], ids=["cold", "hot"])
def app(azurite: Azurite, request: pytest.FixtureRequest) -> Iterator[str]:
    """cold: no cache of completed keys (a duplicate seen by another instance)."""
    with fresh_app(azurite, DEDUP_CACHE_SIZE=request.param):
        shared_store()  # tables created before we count
        flush_expiry_notes()  # ... and no earlier test's store writes its notes while we do
        yield request.param


def test_outcomes_duplicates_latency_and_store_requests_are_counted(app: str) -> None:
    items = user_function("items")
    body = item(f"i-{uuid.uuid4().hex[:8]}", 3.0)
    before = points()
    items(servicebus_message(body, body["id"]))
    after_new = points()
    items(servicebus_message(body, body["id"], delivery_count=2))
    items(servicebus_message(body, body["id"], delivery_count=3))
    after_duplicates = points()
    items(servicebus_message({**body, "amount": 4.0}, body["id"]))
    after = points()

    assert delta(before, after, "dedup.outcomes", consumer="items", outcome="processed") == 1
    assert delta(before, after, "dedup.outcomes", consumer="items", outcome="duplicate") == 2
    assert delta(before, after, "dedup.outcomes", consumer="items", outcome="conflict") == 1
    assert delta(before, after, "dedup.duplicates", consumer="items") == 2
    assert delta(before, after, "dedup.duration", consumer="items", outcome="duplicate") == 2  # histogram count
    # The physical limit: one store request for a new message, one for each duplicate —
    # none when this instance saw the key completed (hot).
    hot = app != "0"
    assert delta(before, after, "dedup.claim.duration", consumer="items") == (2 if hot else 4)
    assert total(after_new, "dedup.store.requests") - total(before, "dedup.store.requests") == 1
    assert total(after_duplicates, "dedup.store.requests") - total(after_new, "dedup.store.requests") == (
        0 if hot else 2
    )
    # A mismatch: the commit, one read of the stored fingerprint, the dead-letter record.
    assert total(after, "dedup.store.requests") - total(after_duplicates, "dedup.store.requests") == 3


def test_a_span_per_message_continues_the_incoming_trace(app: str) -> None:
    SPANS.clear()
    trace_id = uuid.uuid4().hex
    traceparent = f"00-{trace_id}-{'b7ad6b7169203331'}-01"
    body = item(f"i-{uuid.uuid4().hex[:8]}", 3.0)
    message = servicebus_message(body, body["id"])
    message.application_properties["traceparent"] = traceparent  # type: ignore[index]
    user_function("items")(message)
    [span] = [s for s in SPANS.get_finished_spans() if s.name == "dedup items"]
    assert f"{span.context.trace_id:032x}" == trace_id
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert span.attributes is not None and span.attributes["dedup.outcome"] == "processed"
    assert span.attributes["dedup.key"] == body["id"]


def test_each_message_span_is_current_while_its_own_handler_runs() -> None:
    """A handler's own spans (a downstream call) are children of its message's span — in a
    batch too, where every message has a span of its own."""
    tracer = trace.get_tracer("test")

    def handler(payload: Any, context: Context) -> Effects:
        with tracer.start_as_current_span(f"work {context.key.id}"):
            return Effects([Entity(f"thing {context.key.id}", payload)])

    flow = IdempotentConsumer("spans", MemoryStore(), handler, config=DedupConfig(cache_size=0),
                              partition_for=lambda key: "one")  # fmt: skip
    for ids in (["m-1"], ["m-2", "m-3", "m-4"]):
        SPANS.clear()
        results = flow.process_batch([Delivery(b'{"n": 1}', message_id=i) for i in ids])
        assert [r.outcome for r in results] == [Outcome.PROCESSED] * len(ids)
        finished = SPANS.get_finished_spans()
        message_spans = {s.attributes["messaging.message.id"]: s for s in finished if s.name == "dedup spans"}  # type: ignore[index]
        for i in ids:
            [work] = [s for s in finished if s.name == f"work {i}"]
            assert work.parent is not None and work.parent.span_id == message_spans[i].context.span_id


# -- what the alerts and the workbook read (infra/modules/alerts.bicep, workbook.json) -------------

INFRA = Path(__file__).resolve().parents[2] / "infra" / "modules"
NAMES = re.compile(r'name (?:==|in) \(?("[\w.]+"(?:, "[\w.]+")*)\)?')
DIMENSIONS = re.compile(r'customDimensions\.(\w+)\) (?:==|in) \(?("[\w.]+"(?:, "[\w.]+")*)\)?')
GROUPED = re.compile(r"customDimensions\.(\w+)\)")


def queries() -> list[str]:
    alerts = re.findall(r"query: '([^']+)'", (INFRA / "alerts.bicep").read_text())
    workbook = json.loads((INFRA / "workbook.json").read_text())
    return alerts + [item["content"]["query"] for item in workbook["items"] if "query" in item["content"]]


def test_every_alert_and_chart_reads_telemetry_the_code_emits(azurite: Azurite) -> None:
    """Each situation an alert watches is made to happen; then every metric name and
    dimension value the queries filter on, and every dimension they group by, is found
    among what the code recorded."""
    emit_every_alerted_situation(azurite)
    emitted = points()
    names = {name for name, _ in emitted}
    pairs = {(name, key, str(value)) for name, attributes in emitted for key, value in attributes}
    found = [query for query in queries() if not query.startswith("traces ")]  # the host's logs: below
    assert len(found) == 9 + 5
    for query in found:
        wanted = {n.strip('"') for group in NAMES.findall(query) for n in group.split(", ")}
        assert wanted and wanted <= names, (query, wanted - names)
        for key, values in DIMENSIONS.findall(query):
            for value in (v.strip('"') for v in values.split(", ")):
                assert any((name, key, value) in pairs for name in wanted), (query, key, value)
        for key in GROUPED.findall(query):
            assert any(k == key for name, k, _ in pairs if name in wanted), (query, key)


def emit_every_alerted_situation(azurite: Azurite) -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from shared.idempotency.audit import Account, Gap, report
    from shared.idempotency.messages import utcnow
    from shared.idempotency.outbox import Outbox
    from shared.idempotency.reconcile import escalate_stale_claims
    from shared.idempotency.stores import Marker, State
    from shared.idempotency.testing import using_sender, using_store

    store = MemoryStore()

    def handler(payload: Any, context: Context) -> Effects:
        return Effects([Entity("e", {"v": payload["v"]})])

    c = IdempotentConsumer("alerts", store, handler, config=DedupConfig(transient_wait=timedelta(0)))
    for body in (b'{"v": 1}', b'{"v": 1}', b'{"v": 2}', b"not json"):  # processed, duplicate, conflict, invalid
        c.process(Delivery(body, message_id="k", delivery_count=1))
    c.process(Delivery(b'{"v": 4}', message_id="k3", enqueued_at=utcnow() - timedelta(days=400)))  # expired
    store.available = False
    transient = c.process(Delivery(b'{"v": 3}', message_id="k2", delivery_count=1))  # transient
    store.available = True
    c.park([(Delivery(b'{"v": 3}', message_id="k2"), transient)])  # parked
    key = DedupKey("alerts", "stuck")
    long_ago = utcnow() - timedelta(days=1)
    store.insert(Marker(key, "p", State.IN_PROGRESS, "fp", long_ago, utcnow() + timedelta(days=1),
                        lease_until=long_ago, owner="o"))  # fmt: skip
    escalate_stale_claims(store, timedelta(minutes=1))  # an escalation
    report(store, Account("alerts", 1, 1, unaccounted=[Gap(1, later=(2, utcnow()))]))  # an audit's loss

    class Down:
        def send(self, messages: Any) -> None:
            raise RuntimeError("down")

    outbox = Outbox(store, Down())
    outbox.park("p", DedupKey("alerts", "o-1"), utcnow() - timedelta(hours=1))
    store.put_entity("p", Entity("~outbox|x", {"destination": "t", "messageId": "m", "body": "{}"}))
    outbox.sweep(utcnow(), since=timedelta(hours=3))  # a failed send: backlog
    store.commit(DedupKey("alerts", "old"), "p", "fp", [], None, utcnow() - timedelta(days=1))  # expired
    with using_store(store), pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEDUP_PURGE_BUDGET", "1")
        user_function("purge_markers")(SimpleNamespace(past_due=False))  # spends its budget: a backlog
    for item_id in ("i-1", "i-2"):  # two keys parked by the tests' items consumer, due
        outbox.park(f"items|{item_id}", DedupKey("items", item_id), utcnow() - outbox.sweep_delay)  # due now
    with using_store(store), using_sender(Down()), pytest.MonkeyPatch.context() as patch:
        patch.setenv("ITEMS_TOPIC", "item-events")
        patch.setenv("DEDUP_OUTBOX_SWEEP_BUDGET", "1")
        user_function("dispatch_outbox")(SimpleNamespace(past_due=False))  # stops at its budget: behind


def test_the_poison_queue_alert_reads_the_line_the_host_logs_as_it_moves_a_message() -> None:
    """The alerts on the host's own logs (``traces``) search for what it writes: the line the
    host's queue processor logs, as lab/queue_host.py logs it too."""
    from lab.queue_host import POISON_LOG

    logged = POISON_LOG.format(5, "returns-poison")
    host_queries = [query for query in queries() if query.startswith("traces ")]
    assert host_queries
    for query in host_queries:
        terms = re.findall(r'message has "([^"]+)"', query)
        assert terms and all(term in logged for term in terms), query


def test_the_messages_a_handler_sends_continue_its_trace_now_and_from_the_sweep(azurite: Azurite) -> None:
    """Each outgoing message carries its message's span as ``traceparent`` and ``Diagnostic-Id``
    (application properties on Service Bus; the next consumer's span continues it) — sent at
    once, or by the sweep from another invocation; a trace context the handler set is kept."""
    from shared.idempotency.functions._senders import to_servicebus
    from shared.idempotency.outbox import Outbox

    own = f"00-{uuid.uuid4().hex}-00f067aa0ba902b7-01"
    sent: list[Outgoing] = []

    class Capture:
        down = False

        def send(self, messages: Sequence[Outgoing]) -> None:
            if self.down:
                raise DownstreamUnavailable("the topic is down")
            sent.extend(messages)

    def handler(payload: Any, context: Context) -> Effects:
        own_context = [Outgoing("events", payload, "own", {"traceparent": own}),
                       Outgoing("events", payload, "legacy", {"Diagnostic-Id": own})]  # fmt: skip
        return Effects([Entity("order", payload)], None, [Outgoing("events", payload, "plain"), *own_context])

    store, sender = new_table_store(azurite, lean=True), Capture()
    flow = IdempotentConsumer("traced", store, handler, sender=sender, config=DedupConfig(transient_wait=timedelta(0)))

    def spans_traceparent(message_id: str) -> str:
        [span] = [
            s
            for s in SPANS.get_finished_spans()
            if s.attributes and s.attributes.get("messaging.message.id") == message_id
        ]
        return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"

    def contexts(message_id: str) -> None:
        """What each message sent carries: its message's span, unless it had a context of its own."""
        mine = spans_traceparent(message_id)
        got = {m.name: (m.properties.get("traceparent"), m.properties.get("Diagnostic-Id")) for m in sent}
        assert got == {"plain": (mine, mine), "own": (own, None), "legacy": (None, own)}

    SPANS.clear()
    incoming = f"00-{uuid.uuid4().hex}-b7ad6b7169203331-01"
    assert flow.process(Delivery(b'{"n": 1}', message_id="m-1", traceparent=incoming)).outcome is Outcome.PROCESSED
    contexts("m-1")
    both = dict.fromkeys(["traceparent", "Diagnostic-Id"], spans_traceparent("m-1"))
    assert to_servicebus(sent[0]).application_properties == both  # the SDK's tracing keeps a Diagnostic-Id set

    sent.clear()
    sender.down = True  # an HTTP call (no delivery count): parked, then sent by the sweep
    assert flow.process(Delivery(b'{"n": 2}', message_id="m-2")).reason == "outbox_parked"
    sender.down = False
    later = utcnow() + DedupConfig().outbox_sweep_delay + timedelta(seconds=1)
    assert Outbox(store, sender).sweep(later, since=timedelta(hours=2)).sent == 3
    contexts("m-2")
