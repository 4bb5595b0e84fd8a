"""The outbox at its edges, on a real store (Azurite): what Service Bus could never take is
refused at the first delivery with a record, nothing committed; a send that keeps failing is
parked and alerted, never acknowledged silently; the sweep sends each key with its own
consumer's sender, pages through any backlog and stops at its budget and deadline."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError

from lab.topic import Topic
from shared.idempotency import Context, DedupConfig, Delivery, Effects, Entity, IdempotentConsumer, Outcome, Outgoing
from shared.idempotency import outbox as outbox_module
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions import ServiceBusSender
from shared.idempotency.messages import utcnow
from shared.idempotency.outbox import DUE, ROWS, Outbox
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing.broker import PeekLockQueue
from tests.functions import ready_messages

NO_WAIT = DedupConfig(transient_wait=timedelta(0))
# check() encodes messages without a connection: this client never opens one.
OFFLINE = ServiceBusClient.from_connection_string(
    "Endpoint=sb://localhost/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"
)


def new_topic(name: str = "order-events") -> Topic:
    return Topic(name, {"billing": PeekLockQueue(60, 10, 0)})


def sending(outgoing: Outgoing) -> Any:
    def handle(payload: Any, context: Context) -> Effects:
        return Effects([Entity("order", {"id": payload["orderId"]})], None, [outgoing])

    return handle


def delivery(order: str, count: int | None = 1) -> Delivery:
    return Delivery(f'{{"orderId":"{order}"}}'.encode(), message_id=order, delivery_count=count)


def index_rows(store: DedupStore, hours: int = 2, since: int = 1) -> list[Entity]:
    now = utcnow()
    return [row for h in range(-since, hours) for row in store.read_entities(
        DUE + f"{now + timedelta(hours=h):%Y%m%d%H}", "", 1000)]  # fmt: skip


REFUSED = {
    "a session id over 128 characters": Outgoing("q", {"n": 1}, "m", session_id="s" * 129),
    "a list property": Outgoing("q", {"n": 1}, "m", {"tags": ["a", "b"]}),  # type: ignore[dict-item]
    "a map property": Outgoing("q", {"n": 1}, "m", {"meta": {"a": 1}}),  # type: ignore[dict-item]
    "an integer over 32 bits (the SDK sends an AMQP int)": Outgoing("q", {"n": 1}, "m", {"big": 2**31}),
    "a body over the size limit": Outgoing("q", {"text": "x" * 5000}, "m"),
}


@pytest.mark.parametrize("count", [1, None], ids=["queue", "http"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_what_service_bus_can_never_take_is_refused_at_the_first_delivery(
    lean_store: TableStore, case: str, count: int | None
) -> None:
    """Refused before the commit, with a reason and a dead-letter record: no marker, no order,
    no outgoing row, no index row for the sweep — never nine waits and a silent acknowledgement."""
    sender = ServiceBusSender(OFFLINE, max_message_bytes=4096)
    c = IdempotentConsumer("orders", lean_store, sending(REFUSED[case]), config=NO_WAIT, sender=sender)
    result = c.process(delivery("o-1", count))
    assert (result.outcome, result.reason, result.acknowledge) == (Outcome.INVALID, "outgoing_refused", True)
    [record] = lean_store.dead_letters("orders")
    assert (record.reason, record.message_id, record.body) == ("outgoing_refused", "o-1", b'{"orderId":"o-1"}')
    key, partition, _ = c.identify(delivery("o-1"))
    assert lean_store.get(key, partition) is None
    assert lean_store.read_entities(partition, "", 10) == [] and index_rows(lean_store) == []


def test_what_service_bus_takes_passes_the_check() -> None:
    sender = ServiceBusSender(OFFLINE, max_message_bytes=4096)
    sender.check([Outgoing("q", {"text": "x" * 3000}, "m", {"a": "b", "n": 2**31 - 1, "f": 1.5, "t": True},
                           session_id="s" * 128, message_id="id")])  # fmt: skip


class Link:
    """A Service Bus sender link that records the batches it sends (the batches are real)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent: list[int] = []

    def create_message_batch(self) -> ServiceBusMessageBatch:
        return ServiceBusMessageBatch(max_size_in_bytes=self.size)

    def send_messages(self, batch: ServiceBusMessageBatch) -> None:
        self.sent.append(len(batch))


class Client:
    def __init__(self, link: Link) -> None:
        self.link = link

    def get_queue_sender(self, destination: str) -> Link:
        return self.link


def test_a_full_batch_is_sent_and_a_refusal_is_never_read_as_a_full_batch() -> None:
    link = Link(1000)
    sender = ServiceBusSender(Client(link))  # type: ignore[arg-type]
    sender.send([Outgoing("q", {"text": "x" * 300}, str(i), message_id=f"id-{i}") for i in range(5)])
    assert (sum(link.sent), len(link.sent) > 1) == (5, True)  # several full batches, every message once
    with pytest.raises(MessageSizeExceededError):  # one message larger than any batch: not an endless loop
        sender.send([Outgoing("q", {"text": "x" * 2000}, "big", message_id="id-big")])
    with pytest.raises(ValueError, match="session_id"):  # a refusal, raised as one: nothing sent for it
        sender.send([Outgoing("q", {}, "s", session_id="s" * 129, message_id="id-s")])
    assert (sum(link.sent), 0 in link.sent) == (5, False)  # never an empty batch sent


class Refusing:
    """A destination that does not exist (or a role not granted): every send fails."""

    def __init__(self) -> None:
        self.attempts = 0

    def send(self, messages: Sequence[Outgoing]) -> None:
        self.attempts += 1
        raise RuntimeError("MessagingEntityNotFoundError: the messaging entity could not be found")


def test_a_send_refused_for_a_deployment_reason_is_waited_for_parked_and_alerted(
    lean_store: TableStore, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = Refusing()
    c = IdempotentConsumer("orders", lean_store, sending(Outgoing("missing", {"n": 1}, "m")), config=NO_WAIT,
                           sender=refusing)  # fmt: skip
    for count in range(1, 10):
        result = c.process(delivery("o-2", count))
        assert (result.outcome, result.reason, result.acknowledge) == (Outcome.TRANSIENT, "dispatch_failed", False)
    with caplog.at_level(logging.ERROR, logger="idempotency"):
        last = c.process(delivery("o-2", 10))
    assert (last.outcome, last.reason, last.acknowledge) == (Outcome.DUPLICATE, "outbox_parked", True)
    assert [r.levelno for r in caplog.records if "left for the sweep" in r.getMessage()] == [logging.ERROR]
    assert len(index_rows(lean_store)) == 1  # parked for the sweep
    later = utcnow() + timedelta(minutes=11)
    with caplog.at_level(logging.ERROR, logger="idempotency"):
        swept = Outbox(lean_store, refusing).sweep(later, since=timedelta(hours=2))
    assert (swept.parked, swept.sent, swept.failed, refusing.attempts) == (1, 0, 1, 11)
    assert any("not sent" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    topic = new_topic("missing")  # the entity is created: the next sweep after the delay sends
    swept = Outbox(lean_store, topic).sweep(later + timedelta(minutes=11), since=timedelta(hours=2))
    assert (swept.parked, swept.sent, topic.sent) == (1, 1, 1)
    assert index_rows(lean_store, hours=3) == []


def test_the_sweep_sends_each_key_with_its_own_consumers_sender(lean_store: TableStore) -> None:
    down = Refusing()
    topics = {"billing-out": new_topic("a"), "shipping-out": new_topic("b")}
    for name, topic in topics.items():
        c = IdempotentConsumer(
            name, lean_store, sending(Outgoing(topic.name, {"n": 1}, "m")), config=NO_WAIT, sender=down
        )
        assert c.process(delivery("o-3", None)).reason == "outbox_parked"  # an HTTP call: parked, answered
    stranger = IdempotentConsumer(
        "gone", lean_store, sending(Outgoing("c", {"n": 1}, "m")), config=NO_WAIT, sender=down
    )
    stranger.process(delivery("o-3", None))  # a consumer the app no longer has
    swept = Outbox(lean_store, down).sweep(utcnow() + timedelta(minutes=11), since=timedelta(hours=2),
                                           senders=dict(topics))  # fmt: skip
    assert (swept.parked, swept.sent, swept.failed) == (3, 2, 1)
    assert [(t.name, t.sent) for t in topics.values()] == [("a", 1), ("b", 1)]
    assert down.attempts == 3  # the three deliveries' own tries; the sweep never used it


def test_the_sweep_pages_through_a_backlog_and_stops_at_its_budget_and_deadline(
    lean_store: TableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "PAGE", 4)
    topic = new_topic()
    outbox = Outbox(lean_store, topic, sweep_delay=timedelta(0))
    now = utcnow()
    for i in range(11):  # parked keys whose deliveries crashed after their commit
        key = IdempotentConsumer("orders", lean_store, sending(Outgoing(topic.name, {}, "m")), config=NO_WAIT).identify(
            delivery(f"o-{i}"))[0]  # fmt: skip
        lean_store.put_entity(f"orders|o-{i}", Entity(outbox_module.rows_prefix(key) + "m", {
            "destination": topic.name, "messageId": f"id-{i}", "body": "{}", "properties": "{}"}))  # fmt: skip
        outbox.park(f"orders|o-{i}", key, now - timedelta(seconds=1))
    assert outbox.sweep(now, since=timedelta(hours=1), deadline=time.monotonic()).left is True  # no time: nothing
    runs = [outbox.sweep(now, since=timedelta(hours=1), budget=5) for _ in range(3)]
    assert [(r.parked, r.sent, r.left) for r in runs] == [(5, 5, True), (5, 5, True), (1, 1, False)]
    assert topic.sent == 11 and outbox.sweep(now, since=timedelta(hours=1)).parked == 0
    assert [lean_store.read_entities(f"orders|o-{i}", ROWS, 5) for i in range(11)] == [[]] * 11


def test_a_failed_send_parks_again_whatever_a_sweep_did_with_the_first_index_row(
    lean_store: TableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that meets the index row between the park and the commit finds nothing to send
    and takes the row: the delivery whose send then fails must index its key again. The
    outbox's clock stands mid-hour: a sweep 5 s ahead never passes the hour of the row."""
    now = utcnow().replace(minute=30)
    monkeypatch.setattr(outbox_module, "utcnow", lambda: now)
    topic, down = new_topic(), Refusing()
    outbox = Outbox(lean_store, topic, sweep_delay=timedelta(0))
    commit_many = lean_store.commit_many

    def swept_first(commits: Any) -> Any:
        assert outbox.sweep(now + timedelta(seconds=5), since=timedelta(hours=1)).parked == 1  # took the row
        return commit_many(commits)

    c = IdempotentConsumer("orders", lean_store, sending(Outgoing(topic.name, {"n": 1}, "m")),
                           config=DedupConfig(transient_wait=timedelta(0), outbox_sweep_delay=timedelta(0)),
                           sender=down)  # fmt: skip
    lean_store.commit_many = swept_first  # type: ignore[method-assign]
    assert c.process(delivery("o-4", None)).reason == "outbox_parked"
    lean_store.commit_many = commit_many  # type: ignore[method-assign]
    swept = outbox.sweep(now + timedelta(seconds=5), since=timedelta(hours=1))
    assert (swept.parked, swept.sent, topic.sent) == (1, 1, 1)


def test_a_dry_run_sees_what_the_sender_could_never_send(lean_store: TableStore) -> None:
    from shared.idempotency.resubmit import dry_run

    sender = ServiceBusSender(OFFLINE, max_message_bytes=4096)
    c = IdempotentConsumer("orders", lean_store, sending(REFUSED["a session id over 128 characters"]), config=NO_WAIT,
                           sender=sender)  # fmt: skip
    verdict, reason = dry_run(c, delivery("o-5"))
    assert (verdict, reason.split(":")[0]) == ("invalid", "outgoing_refused")
    assert lean_store.dead_letters("orders") == [] and list(lean_store.scan()) == []


@pytest.mark.parametrize("text", ["x" * 200_000, "é" * 100_000, "😀" * 50_000], ids=["ascii", "latin", "astral"])
def test_an_outgoing_body_up_to_the_standard_size_is_stored_and_sent_whole(lean_store: TableStore, text: str) -> None:
    """An outgoing row keeps its body in properties a Table holds (64 KiB of UTF-16 each):
    a 200 KB body commits with the marker, and the sweep sends it byte for byte."""
    topic, down = new_topic(), Refusing()
    sender = ServiceBusSender(OFFLINE)  # the check at Standard's 256 KiB
    body = {"text": text}
    c = IdempotentConsumer("orders", lean_store, sending(Outgoing(topic.name, body, "m")), config=NO_WAIT, sender=down)
    sender.check([Outgoing(topic.name, body, "m", message_id="id")])
    assert c.process(delivery("o-6", None)).reason == "outbox_parked"  # committed; its send failed
    swept = Outbox(lean_store, topic).sweep(utcnow() + timedelta(minutes=11), since=timedelta(hours=2))
    assert (swept.sent, topic.sent) == (1, 1)
    [queued] = ready_messages(topic.subscriptions["billing"])
    assert json.loads(queued.body) == body


def backlog(store: TableStore, topic: Topic, n: int) -> tuple[Outbox, Any]:
    """``n`` HTTP orders committed and parked, whose send failed; the outbox to sweep them."""
    c = IdempotentConsumer("orders", store, sending(Outgoing(topic.name, {"n": 1}, "m")),
                           config=DedupConfig(transient_wait=timedelta(0), outbox_sweep_delay=timedelta(0)),
                           sender=Refusing())  # fmt: skip
    for i in range(n):
        assert c.process(delivery(f"o-{i}", None)).reason == "outbox_parked"
    return Outbox(store, topic, sweep_delay=timedelta(0)), utcnow() + timedelta(seconds=5)


def test_a_page_of_parked_keys_is_sent_in_one_call_per_consumer(lean_store: TableStore) -> None:
    topic = new_topic()
    outbox, later = backlog(lean_store, topic, 12)
    swept = outbox.sweep(later, since=timedelta(hours=1))
    assert (swept.parked, swept.sent, topic.attempts, topic.sent) == (12, 12, 1, 12)


def test_a_budget_met_exactly_leaves_no_backlog(lean_store: TableStore) -> None:
    topic = new_topic()
    outbox, later = backlog(lean_store, topic, 6)
    swept = outbox.sweep(later, since=timedelta(hours=1), budget=6)
    assert (swept.parked, swept.left) == (6, False)


@pytest.mark.parametrize(("step", "rows_per_key"), [(timedelta(seconds=1), 1), (timedelta(hours=1), 2)])
def test_a_failed_send_parks_again_under_its_row_unless_a_new_one_falls_in_another_hour(
    lean_store: TableStore, monkeypatch: pytest.MonkeyPatch, step: timedelta, rows_per_key: int
) -> None:
    """Each park reads a clock ``step`` later than the one before. A second later, the row
    written again keeps its name: one row per key, so an exact budget sweeps them all. An
    hour later, a new row would fall in another hour, behind which the sweep's cursor may be:
    a new row, one send."""
    topic = new_topic()
    start = (utcnow() - timedelta(hours=8)).replace(minute=10, second=0, microsecond=0)  # 6 s never cross an hour
    ticks = iter(range(100))
    monkeypatch.setattr(outbox_module, "utcnow", lambda: start + next(ticks) * step)
    outbox, _ = backlog(lean_store, topic, 3)
    monkeypatch.undo()
    assert len(index_rows(lean_store, hours=1, since=9)) == 3 * rows_per_key
    swept = outbox.sweep(utcnow(), since=timedelta(hours=9), budget=3 * rows_per_key)
    assert (swept.parked, swept.left, topic.sent) == (3 * rows_per_key, False, 3)
    assert index_rows(lean_store, hours=1, since=9) == []


def test_a_store_failing_mid_sweep_stops_it_cleanly_and_the_next_sweep_finishes(
    lean_store: TableStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index rows' delete fails after the send: the sweep stops and says work is left;
    the next one finds those keys' rows sent and deleted, and takes their index rows."""
    topic = new_topic()
    outbox, later = backlog(lean_store, topic, 3)
    delete = lean_store.delete_entities

    def failing(partition: str, names: Any) -> None:
        if partition.startswith(DUE):
            raise StoreUnavailable("503 injected")
        delete(partition, names)

    monkeypatch.setattr(lean_store, "delete_entities", failing)
    swept = outbox.sweep(later, since=timedelta(hours=1))
    assert (swept.parked, swept.left, topic.sent) == (0, True, 3)
    monkeypatch.setattr(lean_store, "delete_entities", delete)
    again = outbox.sweep(later, since=timedelta(hours=1))
    assert (again.parked, again.sent, again.left) == (3, 0, False)  # their rows were sent and deleted
    assert (topic.sent, topic.dropped_by_detection) == (3, 0)


def test_a_key_parked_twice_is_sent_once_by_a_sweep(lean_store: TableStore) -> None:
    """A last delivery parks before its commit and again when its send fails: two index rows
    (in other seconds), one key, one page: its messages go out once."""
    topic = new_topic()
    outbox, later = backlog(lean_store, topic, 1)
    key = IdempotentConsumer("orders", lean_store, sending(Outgoing(topic.name, {}, "m")), config=NO_WAIT).identify(
        delivery("o-0"))[0]  # fmt: skip
    outbox.park("orders|o-0", key, utcnow() - timedelta(seconds=3))
    assert len(index_rows(lean_store)) == 2
    swept = outbox.sweep(later, since=timedelta(hours=1))
    assert (swept.parked, swept.sent, topic.sent, topic.dropped_by_detection) == (1, 1, 1, 0)
