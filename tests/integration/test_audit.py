"""The audit (shared.idempotency.audit) accounts for every sequence number a Service Bus queue
gave, from what the consumer stored on the real stores and what the queue still holds (the
broker model, shared/idempotency/testing/broker.py): processed, duplicates (a producer's resend past duplicate
detection), refused, dead-lettered by the broker, in flight — and names what is nowhere."""

from __future__ import annotations

import functools
import json
import logging
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer
from shared.idempotency.audit import Account, ServiceBusPeek, account, checkpoint, report, save
from shared.idempotency.config import DedupConfig
from shared.idempotency.facts import CANARY_PROPERTY
from shared.idempotency.functions import shared_store
from shared.idempotency.functions._servicebus import servicebus_delivery
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import Delivery, Outcome
from shared.idempotency.reasons import Reason
from shared.idempotency.resend import resend
from shared.idempotency.stores import DedupStore, MemoryStore
from shared.idempotency.testing import servicebus_message
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import PeekLockQueue
from tests.functions import fresh_app
from tests.integration.operators import run_tool

SCHEMA = {"type": "object", "required": ["orderId"], "properties": {"orderId": {"type": "string"}}}


def handler(order: dict[str, Any], context: Context) -> Effects:
    return Effects([Entity(f"order|{order['orderId']}", order)])


def consumer(store: DedupStore) -> IdempotentConsumer:
    return IdempotentConsumer("audited", store, handler, schema=SCHEMA, config=DedupConfig(transient_wait=timedelta(0)))


class Run:
    """A queue and the consumer it feeds: what is delivered is processed and completed."""

    def __init__(self, store: DedupStore, first_sequence: int = 1) -> None:
        self.store, self.consumer = store, consumer(store)
        self.queue = PeekLockQueue(lock_duration=30, max_delivery_count=2, duplicate_window=100,
                                   first_sequence=first_sequence)  # fmt: skip
        self.started = datetime.now(UTC)

    def send(self, message_id: str, body: Any, **properties: str) -> None:
        assert self.queue.send(message_id, json.dumps(body).encode(), properties)

    def deliver(self, *, skip: bool = False, fail: bool = False, wait: float = 0) -> Outcome | None:
        """The next message (within ``wait`` seconds): processed (``skip``: completed without it,
        as a host that lost the invocation; ``fail``: abandoned, as a function that raised)."""
        lock = self.queue.receive(timeout=wait)
        assert lock is not None
        if skip or fail:
            self.queue.complete(lock) if skip else self.queue.abandon(lock, "failed")
            return None
        m = lock.message  # as the trigger hands it over (servicebus_delivery: the dedup-key property too)
        delivery = servicebus_delivery(servicebus_message(m.body, m.message_id, delivery_count=lock.delivery_count,
                                                          sequence_number=m.seq, enqueued_time=m.enqueued_at,
                                                          properties=m.properties))  # fmt: skip
        result = self.consumer.process(delivery)
        assert result.acknowledge, result
        self.queue.complete(lock)
        return result.outcome

    def audit(self, after: int = 0) -> Account:
        hour = timedelta(hours=1)
        return account(self.store, "audited", self.queue, after=after, since=self.started - hour,
                       until=datetime.now(UTC) + hour)  # fmt: skip


def test_every_sequence_number_is_accounted_for_once_on_every_store(store: DedupStore) -> None:
    run = Run(store)
    run.send("o-1", {"orderId": "o-1"})  # 1 processed
    run.send("o-2", {"orderId": "o-2"})  # 2 lost: completed, never processed
    run.send("o-bad", {"nope": 1})  # 3 refused (schema): a dead-letter record
    run.send("o-4", {"orderId": "o-4"})  # 4 fails twice: the broker's dead-letter queue
    run.send("dedup-canary-1", {}, **{CANARY_PROPERTY: "timer"})  # 5 the canary
    run.queue.duplicate_window = 0  # the producer's resend comes after the detection window
    run.send("o-1", {"orderId": "o-1"})  # 6 a duplicate with a number of its own
    run.send("o-7", {"orderId": "o-7"})  # 7 still in the queue
    assert [run.deliver(), run.deliver(skip=True), run.deliver(), run.deliver(fail=True)] == [
        Outcome.PROCESSED, None, Outcome.INVALID, None]  # fmt: skip
    assert run.deliver(fail=True) is None  # o-4 again: MaxDeliveryCountExceeded
    assert [run.deliver(), run.deliver()] == [Outcome.PROCESSED, Outcome.DUPLICATE]  # the canary, the resend
    found = run.audit()
    assert (found.first, found.last, found.received) == (1, 7, 7)
    assert found.counts == {"processed": 2, "duplicates": 1, "refused": 1, "dead_lettered": 1, "in_flight": 1}
    assert found.canaries == 1 and [gap.sequence for gap in found.unaccounted] == [2] and not found.closes
    gap = found.unaccounted[0]  # between its neighbours, with their real enqueued times
    assert gap.earlier and gap.later and (gap.earlier[0], gap.later[0]) == (1, 3)
    assert gap.earlier[1] is not None and gap.later[1] is not None and gap.earlier[1] <= gap.later[1]
    assert gap.between().startswith(f"enqueued between {gap.earlier[1].isoformat()} (#1) and ")
    assert run.audit(after=2).closes and run.audit(after=2).received == 5  # the next window starts after it


def test_a_redelivery_of_a_processed_message_counts_once() -> None:
    run = Run(MemoryStore())
    run.send("o-1", {"orderId": "o-1"})
    lock = run.queue.receive(timeout=0)
    assert lock is not None
    delivery = Delivery(lock.message.body, "o-1", delivery_count=1, sequence=lock.message.seq,
                        enqueued_at=lock.message.enqueued_at)  # fmt: skip
    assert run.consumer.process(delivery).outcome is Outcome.PROCESSED
    again = Delivery(
        delivery.body, "o-1", delivery_count=2, sequence=delivery.sequence, enqueued_at=delivery.enqueued_at
    )
    assert run.consumer.process(again).outcome is Outcome.DUPLICATE  # its settlement was lost: delivered again
    run.queue.complete(lock)
    found = run.audit()
    assert (found.received, found.counts["processed"], found.counts["duplicates"], found.closes) == (1, 1, 0, True)


def test_a_loss_at_the_end_of_a_window_is_found_once_a_later_message_is_seen() -> None:
    run = Run(MemoryStore())
    run.send("o-1", {"orderId": "o-1"})
    run.send("o-2", {"orderId": "o-2"})
    run.deliver()
    run.deliver(skip=True)
    assert run.audit().received == 1 and run.audit().closes  # nothing after it yet: the window ends at 1
    run.send("dedup-canary-1", {}, **{CANARY_PROPERTY: "timer"})
    run.deliver()
    assert [gap.sequence for gap in run.audit().unaccounted] == [2]


def test_a_business_message_with_the_canary_property_but_not_its_id_runs_its_handler() -> None:
    """A property set by mistake never skips a handler: a canary is its property and its id."""
    run = Run(MemoryStore())
    run.send("o-1", {"orderId": "o-1"}, **{CANARY_PROPERTY: "by mistake"})
    assert run.deliver() is Outcome.PROCESSED
    found = run.audit()
    assert (found.counts["processed"], found.canaries) == (1, 0)
    assert [e.data["orderId"] for e in run.store.read_entities(run.consumer.partition_of(
        DedupKey("audited", "o-1")), "order|", 10)] == ["o-1"]  # fmt: skip


def test_a_duplicate_that_cannot_be_recorded_goes_back_to_the_broker() -> None:
    store = MemoryStore()
    run = Run(store)
    run.send("o-1", {"orderId": "o-1"})
    run.deliver()
    store.available = False
    delivery = Delivery(b'{"orderId": "o-1"}', "o-1", delivery_count=1, sequence=9, enqueued_at=datetime.now(UTC))
    result = run.consumer.process(delivery)
    assert (result.outcome, result.reason) == (Outcome.TRANSIENT, Reason.STORE_UNAVAILABLE)


@pytest.mark.parametrize("sequence", [None, 5])
def test_a_duplicate_costs_one_small_insert_only_with_a_sequence_number(sequence: int | None) -> None:
    store = MemoryStore()
    c = consumer(store)
    first = Delivery(b'{"orderId": "o-1"}', "o-1", sequence=None if sequence is None else 4,
                     enqueued_at=datetime.now(UTC))  # fmt: skip
    assert c.process(first).outcome is Outcome.PROCESSED
    again = Delivery(first.body, "o-1", sequence=sequence, enqueued_at=datetime.now(UTC))
    assert c.process(again).outcome is Outcome.DUPLICATE
    seen = [item for item in store.scan() if item.key is not None and item.key.scope == "audited|seen"]
    assert [item.key.id for item in seen if item.key is not None] == ([] if sequence is None else ["5"])


def test_a_saved_window_is_where_the_next_audit_starts_and_its_losses_are_recorded_once(store: DedupStore) -> None:
    run = Run(store)
    for n in range(1, 5):
        run.send(f"o-{n}", {"orderId": f"o-{n}"})
    for skip in (False, True, False, False):  # 2 never reaches the function
        run.deliver(skip=skip)
    until = datetime.now(UTC) + timedelta(hours=1)
    found = run.audit()
    report(store, found)
    save(store, found, until)
    assert checkpoint(store, "audited") == (4, until)
    [record] = [d for d in store.dead_letters("audited") if d.reason == Reason.UNACCOUNTED]
    assert (record.sequence, record.body) == (2, b"")
    again = run.audit()  # the same window read again: the record of a loss is not a refusal
    assert [gap.sequence for gap in again.unaccounted] == [2] and again.counts["refused"] == 0
    run.send("o-5", {"orderId": "o-5"})
    run.deliver()
    after = run.audit(after=4)
    assert (after.first, after.last, after.closes) == (5, 5, True)


def test_a_resend_under_the_same_message_id_is_dropped_and_the_templates_resubmission_loses_nothing(
    store: DedupStore,
) -> None:
    """Inside the duplicate-detection window the queue drops a resend that reuses a MessageId,
    as Service Bus does (silently): another tool's resubmission loses the message, and the audit
    names it. The template's (shared.idempotency.resend) sends it under a new MessageId with its
    key in a property: applied once, and its first number accounted for as dead-lettered."""
    run = Run(store)
    run.send("o-1", {"orderId": "o-1"})
    run.send("o-2", {"orderId": "o-2"})
    for _ in range(2):  # two deliveries each, both failed: the broker dead-letters them
        run.deliver(fail=True)
        run.deliver(fail=True)
    assert [m.message_id for m in run.queue.dead] == ["o-1", "o-2"]
    other_tool = run.queue.dead_letter_queue().receive(1)[0]
    run.queue.dead.remove(other_tool.lock)
    assert run.queue.send(other_tool.message_id, other_tool.body) is False  # dropped: o-1 is gone
    [(parked, new_id)] = resend(store, "audited", run.queue.dead_letter_queue(), 10)
    assert (parked.message_id, run.queue.dead) == ("o-2", []) and new_id != "o-2"
    assert run.deliver() is Outcome.PROCESSED
    assert [e.data["orderId"] for e in store.read_entities(run.consumer.partition_of(
        DedupKey("audited", "o-2")), "order|", 10)] == ["o-2"]  # fmt: skip
    found = run.audit()
    assert (found.received, found.counts["processed"], found.counts["dead_lettered"]) == (3, 1, 1)
    assert [gap.sequence for gap in found.unaccounted] == [1]  # what the other tool lost


# -- the operator's command (docs/operations.md), as a user runs it ------------------------------

AZURE = os.environ.get("AUDIT_SERVICEBUS_CONNECTION")  # a namespace to peek: the test sends to AUDIT_SERVICEBUS_QUEUE
ON_AZURE = pytest.mark.skipif(not AZURE, reason="peeking needs Service Bus itself (there is no local emulator here): "
                              "set AUDIT_SERVICEBUS_CONNECTION and AUDIT_SERVICEBUS_QUEUE (a queue with duplicate "
                              "detection, nothing reading it) to run it")  # fmt: skip


@pytest.mark.parametrize("tool", ["shared.idempotency.audit", "shared.idempotency.resend"])
def test_the_commands_without_a_service_bus_connection_say_so_in_one_line(azurite: Azurite, tool: str) -> None:
    with fresh_app(azurite):
        shared_store()  # the app's tables, as the app creates them (a command never does)
        done = run_tool(tool, "--consumer", "items", "--queue", "items", "--consumers", "tests.app",
                        ServiceBusConnection="", ServiceBusConnection__fullyQualifiedNamespace="")  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert "ServiceBusConnection" in done.stderr


@ON_AZURE
def test_on_service_bus_a_dropped_resend_takes_no_sequence_number_and_the_command_accounts_for_a_queue(
    azurite: Azurite,
) -> None:
    """What only the service can tell: a send that duplicate detection drops takes no sequence
    number (else every dropped resend would be a gap, and the audit would report it lost), and a
    dead-lettered message keeps its number. Then the command, as written, on that queue."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    queue = os.environ["AUDIT_SERVICEBUS_QUEUE"]
    client = ServiceBusClient.from_connection_string(str(AZURE))
    ids = [f"audit-{uuid.uuid4().hex}" for _ in range(2)]
    peek = ServiceBusPeek(client, queue)
    with client, client.get_queue_sender(queue) as sender:
        start = max((p.sequence for p in peek.peek(0, 250)), default=0)
        for message_id in (ids[0], ids[0], ids[1]):  # the second, a resend inside the detection window
            sender.send_messages(ServiceBusMessage(b"{}", message_id=message_id))
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            numbers = {m.message_id: m.sequence_number or 0 for m in receiver.peek_messages(250, sequence_number=start)}
            for message in receiver.receive_messages(max_message_count=250, max_wait_time=5):
                if message.message_id == ids[1]:
                    receiver.dead_letter_message(message, reason="audit test")
        dead = [p.sequence for p in peek.peek_dead_letters(numbers[ids[0]], 250)]
    assert numbers[ids[1]] - numbers[ids[0]] == 1, numbers  # the dropped resend took no number
    assert numbers[ids[1]] in dead  # dead-lettered, it keeps its number
    with fresh_app(azurite):
        done = run_tool("shared.idempotency.audit", "--consumer", "items", "--queue", queue, "--settle", "PT0S",
                        "--consumers", "tests.app", ServiceBusConnection=str(AZURE))  # fmt: skip
        assert done.returncode in (0, 1) and json.loads(done.stdout.splitlines()[-1])["consumer"] == "items", (
            done.stderr
        )
        resent = run_tool("shared.idempotency.resend", "--consumer", "items", "--queue", queue, "--consumers",
                          "tests.app", ServiceBusConnection=str(AZURE))  # fmt: skip
    assert resent.returncode == 0 and json.loads(resent.stdout.splitlines()[-1])["resent"] >= 1, resent.stderr
    assert any(line.endswith("\t" + ids[1]) for line in resent.stdout.splitlines())  # under its key, a new id


def test_the_audit_timer_audits_each_consumer_its_setting_names_and_saves_its_window(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``audit_consumers`` (``audit_now``) on the broker model: the consumer named, its queue
    peeked, a loss recorded and the window saved; a consumer the app does not declare is said,
    not fatal."""
    from shared.idempotency import audit as audit_module
    from shared.idempotency.functions import _housekeeping as timers

    store = MemoryStore()
    run = Run(store)
    for n in range(1, 4):
        run.send(f"o-{n}", {"orderId": f"o-{n}"})
    for skip in (False, True, False):  # 2 never reaches the function
        run.deliver(skip=skip)

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    peeked: list[tuple[Any, ...]] = []

    def peek(client: Client, queue: str | None, topic: str | None, subscription: str | None) -> PeekLockQueue:
        peeked.append((queue, topic, subscription))
        return run.queue

    monkeypatch.setattr(timers, "declared", lambda: [run.consumer])  # the app's consumers
    monkeypatch.setattr(timers, "servicebus_client", lambda who: Client())
    monkeypatch.setattr(audit_module, "ServiceBusPeek", peek)
    monkeypatch.setattr(audit_module, "run", functools.partial(audit_module.run, settle=timedelta(0)))
    timers.audit_now("gone=elsewhere, audited=orders")
    assert peeked == [("orders", None, None)]
    assert [d.sequence for d in store.dead_letters("audited") if d.reason == Reason.UNACCOUNTED] == [2]
    assert checkpoint(store, "audited") is not None and checkpoint(store, "audited")[0] == 3  # type: ignore[index]
    assert "DEDUP_AUDIT names consumer 'gone', which the app does not declare" in caplog.text


def test_every_service_bus_consumer_of_the_app_is_audited_by_default() -> None:
    """What the audit timer reads by default, found from the app's own declarations: each Service
    Bus trigger with the consumer its function hands messages to — a queue's, a subscription's, a
    batch's; not a session queue's (peeked session by session), nor an Event Grid consumer's."""
    import tests.app
    from shared.idempotency.functions._housekeeping import audited_consumers

    found = {build.name: entity for build, entity in audited_consumers([tests.app.bp])}
    assert found == {"queue_consumer": ("items", None, None), "subscriber_consumer": (None, "items", "subscriber"),
                     "batch_consumer": ("item-batch", None, None)}  # fmt: skip


def test_the_audit_setting_only_overrides_or_excludes_what_the_app_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.idempotency import audit as audit_module
    from shared.idempotency.functions import _housekeeping as timers
    from shared.idempotency.functions._app import Once

    store = MemoryStore()
    audited_ones, peeked = (
        [Once(lambda: consumer(store)), Once(lambda: IdempotentConsumer("other", store, handler))],
        [],
    )

    class Client:
        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(timers, "declared", lambda: [build() for build in audited_ones])
    monkeypatch.setattr(timers, "servicebus_client", lambda who: Client())

    def run(store: Any, name: str, entity: Any, keep: bool, kept_for: Any) -> Account:
        peeked.append((name, entity))
        return Account(name, 1, 0)

    monkeypatch.setattr(audit_module, "run", run)
    monkeypatch.setattr(audit_module, "ServiceBusPeek", lambda client, *entity: entity)
    monkeypatch.setenv("OTHER_QUEUE", "others")
    derived = [(audited_ones[0], ("orders", None, None)), (audited_ones[1], ("%OTHER_QUEUE%", None, None))]
    timers.audit_now("", derived)
    assert peeked == [("audited", ("orders", None, None)), ("other", ("others", None, None))]  # %SETTING% read
    peeked.clear()
    timers.audit_now("-other, audited=t/s", derived)  # one excluded, one audited elsewhere
    assert peeked == [("audited", (None, "t", "s"))]


@pytest.mark.parametrize("setting", ["orders", "=q", "a=", "a=t/", "a=/s", "a=t/s/x"])
def test_a_dedup_audit_setting_that_names_no_entity_is_refused_in_one_line(setting: str) -> None:
    from shared.idempotency.audit import audited
    from shared.idempotency.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="consumer=queue, consumer=topic/subscription or -consumer"):
        audited(setting)


def test_a_dedup_audit_setting_names_queues_and_subscriptions() -> None:
    from shared.idempotency.audit import audited

    assert audited(" orders=orders ,billing=order-events/billing,") == [
        ("orders", ("orders", None, None)), ("billing", (None, "order-events", "billing"))]  # fmt: skip
    assert audited("") == []


def test_a_scheduled_message_is_numbered_when_sent_seen_in_flight_until_its_time_then_processed() -> None:
    """Service Bus numbers a scheduled message when it is sent and shows it to a peek until it is
    enqueued: the audit counts it in flight, then processed; a later number never waits for it."""
    run = Run(MemoryStore())
    assert run.queue.send("o-1", json.dumps({"orderId": "o-1"}).encode(), {}, scheduled_in=0.3)
    run.send("o-2", {"orderId": "o-2"})
    assert run.deliver() == Outcome.PROCESSED  # o-2: the scheduled one is not there yet
    found = run.audit()
    assert (found.first, found.last, found.counts["in_flight"], found.counts["processed"]) == (1, 2, 1, 1)
    assert run.deliver(wait=5) == Outcome.PROCESSED  # its time came
    found = run.audit()
    assert (found.counts["in_flight"], found.counts["processed"], found.closes) == (0, 2, True)


# -- the window: where it starts, how far back, how large ---------------------------------------


def test_a_first_window_with_nothing_recorded_starts_at_what_the_broker_holds_not_at_one(store: DedupStore) -> None:
    """An entity long in use (numbers past 20,000,000), the consumer new: nothing recorded, three
    messages dead-lettered. The first window is those three — not 20 million numbers from 1, each
    a false loss and a record."""
    run = Run(store, first_sequence=20_000_001)
    for n in range(3):
        run.send(f"o-{n}", {"nope": n})
    for _ in range(6):
        run.deliver(fail=True)  # each fails twice: the broker dead-letters it
    assert len(run.queue.dead) == 3
    found = run_audit(run, keep=True)
    assert (found.first, found.last, found.counts["dead_lettered"], found.closes) == (20_000_001, 20_000_003, 3, True)
    assert [d for d in store.dead_letters("audited") if d.reason == Reason.UNACCOUNTED] == []
    assert checkpoint(store, "audited") is not None and checkpoint(store, "audited")[0] == 20_000_003  # type: ignore[index]


def test_nothing_recorded_nor_held_is_nothing_to_audit_and_no_checkpoint(store: DedupStore) -> None:
    found = run_audit(Run(store, first_sequence=5_000_000), keep=True)
    assert (found.received, found.closes, checkpoint(store, "audited")) == (0, True, None)


def test_a_window_older_than_the_store_keeps_its_facts_is_not_judged_and_says_so(store: DedupStore) -> None:
    """The last audit saved 40 days ago: its facts may be purged since (dead-letter records after
    14 days, markers after 30). The numbers in between are not judged, and the account says so;
    the audit starts again from what the store keeps."""
    run = Run(store, first_sequence=5)  # 1..4: enqueued long ago, their facts gone since
    run.send("o-5", {"orderId": "o-5"})
    run.deliver()
    save(store, Account("audited", 1, 0), datetime.now(UTC) - timedelta(days=40))  # a window that ended long ago
    found = run_audit(run, keep=True)
    assert (found.first, found.last, found.closes) == (5, 5, True)
    assert len(found.skipped) == 1 and found.skipped[0].startswith("1..4: enqueued before ")
    assert "longer ago than the store keeps their facts" in found.skipped[0]
    run.send("o-6", {"orderId": "o-6"})
    run.deliver()
    again = run_audit(run, keep=True)  # goes on from there: never back, nothing skipped again
    assert (again.first, again.last, again.closes, again.skipped) == (6, 6, True, [])


def test_a_window_over_the_bound_is_cut_by_the_timer_and_refused_by_the_reading_command(
    store: DedupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_WINDOW numbers per run (here 5): the timer (``keep``) audits the first 5, saves, and the
    next run goes on; a read-only audit refuses (the command's exit 2)."""
    from shared.idempotency import audit as audit_module

    monkeypatch.setattr(audit_module, "MAX_WINDOW", 5)
    run = Run(store)
    for n in range(1, 9):
        run.send(f"o-{n}", {"orderId": f"o-{n}"})
        run.deliver()
    with pytest.raises(audit_module.WindowTooLarge, match="holds 8 sequence numbers, over 5"):
        run_audit(run, keep=False)
    first = run_audit(run, keep=True)
    assert (first.first, first.last, first.closes) == (1, 5, True) and "6..8" in first.skipped[0]
    second = run_audit(run, keep=True)
    assert (second.first, second.last, second.closes, second.skipped) == (6, 8, True, [])


def test_a_read_only_audit_writes_nothing(store: DedupStore) -> None:
    run = Run(store)
    run.send("o-1", {"orderId": "o-1"})
    run.send("o-2", {"orderId": "o-2"})
    run.send("dedup-canary-1", {}, **{CANARY_PROPERTY: "timer"})
    run.deliver()
    run.deliver(skip=True)  # lost
    run.deliver()
    before = sorted((i.name, str(i.data)) for i in store.scan())
    found = run_audit(run, keep=False)
    assert [gap.sequence for gap in found.unaccounted] == [2]
    assert sorted((i.name, str(i.data)) for i in store.scan()) == before and store.dead_letters("audited") == []


def run_audit(run: Run, *, keep: bool) -> Account:
    from shared.idempotency.audit import run as audit_run

    return audit_run(run.store, "audited", run.queue, settle=timedelta(0), keep=keep)


def test_a_first_window_finds_what_is_held_past_a_page_of_old_dead_letters(store: DedupStore) -> None:
    """An entity past #1,000,000 whose DLQ holds 300 messages dead-lettered long ago, then two
    recent ones: the first window starts at the recent ones, not at "nothing to audit"."""
    run = Run(store, first_sequence=1_000_001)
    for n in range(302):
        run.send(f"o-{n}", {"nope": n})
    for _ in range(604):
        run.deliver(fail=True)
    for old in run.queue.dead[:300]:
        old.enqueued_at -= timedelta(days=30)  # before the first window's week
    found = run_audit(run, keep=False)
    assert (found.first, found.last, found.counts["dead_lettered"], found.closes) == (1_000_301, 1_000_302, 2, True)


def test_a_cut_window_goes_on_where_it_stopped_even_when_the_facts_are_kept_briefly(
    store: DedupStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Markers kept an hour (the first window then starts at what is kept): a window cut at
    MAX_WINDOW is followed by the rest, never started over."""
    from shared.idempotency import audit as audit_module

    monkeypatch.setattr(audit_module, "MAX_WINDOW", 5)
    run = Run(store)
    for n in range(1, 9):
        run.send(f"o-{n}", {"orderId": f"o-{n}"})
        run.deliver()
    windows = [audit_module.run(store, "audited", run.queue, settle=timedelta(0), keep=True,
                                kept_for=timedelta(hours=1)) for _ in range(3)]  # fmt: skip
    assert [(w.first, w.last, w.closes) for w in windows] == [(1, 5, True), (6, 8, True), (9, 8, True)]


def test_the_consumer_a_function_hands_messages_to_is_found_through_decorators_and_closures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found: named directly, through a ``functools.wraps`` decorator, in a closure. Not found,
    each said: a function that hands messages to a helper; a consumer fed by two entities."""
    import azure.functions as func

    from shared.idempotency.functions import consumer, on_servicebus
    from shared.idempotency.functions._housekeeping import audited_consumers

    @consumer
    def direct() -> IdempotentConsumer:
        return IdempotentConsumer("direct", MemoryStore(), handler)

    @consumer
    def wrapped() -> IdempotentConsumer:
        return IdempotentConsumer("wrapped", MemoryStore(), handler)

    @consumer
    def twice() -> IdempotentConsumer:
        return IdempotentConsumer("twice", MemoryStore(), handler)

    def logged(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(msg: func.ServiceBusMessage) -> None:
            function(msg)

        return wrapper

    def helper(msg: func.ServiceBusMessage) -> None:
        on_servicebus(direct, msg)

    bp = func.Blueprint()  # type: ignore[no-untyped-call]
    trigger = functools.partial(bp.service_bus_queue_trigger, arg_name="msg", connection="ServiceBusConnection")

    @bp.function_name("plain")
    @trigger(queue_name="q-plain")
    def plain(msg: func.ServiceBusMessage) -> None:
        on_servicebus(direct, msg)

    @bp.function_name("decorated")
    @trigger(queue_name="q-decorated")
    @logged
    def decorated(msg: func.ServiceBusMessage) -> None:
        on_servicebus(wrapped, msg)

    held = twice

    @bp.function_name("closure")
    @trigger(queue_name="q-closure")
    def closure(msg: func.ServiceBusMessage) -> None:
        on_servicebus(held, msg)

    @bp.function_name("again")
    @trigger(queue_name="q-again")
    def again(msg: func.ServiceBusMessage) -> None:
        on_servicebus(held, msg)

    @bp.function_name("helped")
    @trigger(queue_name="q-helped")
    def helped(msg: func.ServiceBusMessage) -> None:
        helper(msg)

    with caplog.at_level(logging.WARNING, logger="idempotency"):
        found = [(build.name, entity[0]) for build, entity in audited_consumers([bp])]
    assert found == [("direct", "q-plain"), ("wrapped", "q-decorated")]
    assert "function helped reads Service Bus but names no declared consumer" in caplog.text
    assert "twice reads several Service Bus entities" in caplog.text
