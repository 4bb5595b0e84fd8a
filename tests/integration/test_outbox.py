"""The outbox on a real store (Azurite, both transaction paths): what a handler sends is
committed with its marker, sent after the commit, and sent again on every duplicate until
sent; the sweep sends what nobody will redeliver. Counts are exact: messages the topic
took, re-sends dropped by duplicate detection, copies per subscription."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from lab.topic import Topic
from shared.idempotency import Context, DedupConfig, Delivery, Effects, Entity, IdempotentConsumer, Outcome, Outgoing
from shared.idempotency.messages import utcnow
from shared.idempotency.outbox import DUE, ROWS, Outbox, message_id
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing import entities, using_sender
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import PeekLockQueue
from tests.app import effects_by_item, item, queue_consumer, subscriber_consumer
from tests.conftest import new_table_store
from tests.functions import fresh_app, ready_messages

NO_WAIT = DedupConfig(transient_wait=timedelta(0))


class Crash(BaseException):
    """The process dies: nothing after it runs, nothing is settled."""


# Its own: every test on both commit paths (conftest's table_store and lean_store take one each).
@pytest.fixture(params=[False, True], ids=["sdk", "lean"])
def store(request: pytest.FixtureRequest, azurite: Azurite) -> TableStore:
    return new_table_store(azurite, lean=request.param)


@pytest.fixture
def topic() -> Topic:
    queues = {name: PeekLockQueue(60, 10, 0) for name in ("billing", "shipping")}
    return Topic("order-events", queues)


def accept(payload: Any, context: Context) -> Effects:
    order = payload["orderId"]
    return Effects([Entity("order", {"id": order})], {"accepted": order},
                   [Outgoing("order-events", {"type": "OrderAccepted", "orderId": order}, "accepted")])  # fmt: skip


def consumer(store: DedupStore, sender: Any, config: DedupConfig = NO_WAIT) -> IdempotentConsumer:
    return IdempotentConsumer("orders", store, accept, config=config, sender=sender)


def delivery(order: str, count: int | None = 1) -> Delivery:
    return Delivery(f'{{"orderId":"{order}"}}'.encode(), message_id=order, delivery_count=count)


def copies(topic: Topic) -> dict[str, int]:
    return {name: queue.sent for name, queue in topic.subscriptions.items()}


def outbox_rows(store: DedupStore, partition: str) -> list[Entity]:
    return store.read_entities(partition, ROWS, 100)


def test_a_new_message_commits_its_outgoing_one_then_sends_it_once(store: TableStore, topic: Topic) -> None:
    c = consumer(store, topic)
    assert c.process(delivery("o-1")).outcome is Outcome.PROCESSED
    assert (topic.sent, copies(topic)) == (1, {"billing": 1, "shipping": 1})
    [queued] = ready_messages(topic.subscriptions["billing"])
    assert queued.message_id == message_id(c.identify(delivery("o-1"))[0], "accepted")
    assert outbox_rows(store, "orders|o-1") == []  # sent, then deleted
    assert [e["id"] for e in entities(store, "order", "orders|o-1")] == ["o-1"]
    assert c.process(delivery("o-1", 2)).outcome is Outcome.DUPLICATE  # a lost completion: nothing re-sent
    assert (topic.attempts, topic.sent) == (1, 1)


def test_the_outgoing_message_commits_with_the_marker_or_not_at_all(store: TableStore, topic: Topic) -> None:
    """Its id is deterministic and its row is in the marker's transaction: the commit that
    fails on an existing entity writes no outgoing row either."""
    store.put_entity("orders|o-2", Entity("order", {"id": "someone else's"}))  # the business row exists
    c = consumer(store, topic)
    assert c.process(delivery("o-2")).outcome is Outcome.DUPLICATE  # an entity outlived its marker
    assert outbox_rows(store, "orders|o-2") == [] and topic.attempts == 0


def test_a_failed_send_goes_back_to_the_broker_and_the_redelivery_sends_it(store: TableStore, topic: Topic) -> None:
    c = consumer(store, topic)
    topic.fail_before = 1
    result = c.process(delivery("o-3"))
    assert (result.outcome, result.reason, result.acknowledge) == (Outcome.TRANSIENT, "dispatch_failed", False)
    assert len(outbox_rows(store, "orders|o-3")) == 1 and topic.sent == 0  # committed, not sent
    assert c.process(delivery("o-3", 2)).outcome is Outcome.DUPLICATE  # the marker is there: the rows are sent
    assert (topic.sent, topic.attempts, copies(topic)) == (1, 2, {"billing": 1, "shipping": 1})
    assert outbox_rows(store, "orders|o-3") == []


def test_a_failed_send_is_waited_out_inside_the_delivery(store: TableStore, topic: Topic) -> None:
    c = consumer(store, topic, DedupConfig(transient_wait=timedelta(seconds=5)))
    topic.fail_before = 2
    assert c.process(delivery("o-4")).outcome is Outcome.PROCESSED
    assert (topic.sent, topic.attempts) == (1, 3)


def test_a_lost_send_acknowledgement_resends_the_same_id_which_detection_drops(store: TableStore, topic: Topic) -> None:
    c = consumer(store, topic)
    topic.lose_ack = 1
    assert c.process(delivery("o-5")).reason == "dispatch_failed"
    assert c.process(delivery("o-5", 2)).outcome is Outcome.DUPLICATE
    assert (topic.sent, topic.dropped_by_detection, copies(topic)) == (1, 1, {"billing": 1, "shipping": 1})


def test_a_crash_between_commit_and_send_loses_nothing(store: TableStore, topic: Topic) -> None:
    crashing = CrashingSender(topic)
    with pytest.raises(Crash):
        consumer(store, crashing).process(delivery("o-6"))
    assert len(outbox_rows(store, "orders|o-6")) == 1 and topic.sent == 0
    assert consumer(store, topic).process(delivery("o-6", 2)).outcome is Outcome.DUPLICATE  # the lock lapsed
    assert (topic.sent, copies(topic)) == (1, {"billing": 1, "shipping": 1})


class CrashingSender:
    def __init__(self, topic: Topic) -> None:
        self.topic = topic

    def send(self, messages: Sequence[Outgoing]) -> None:
        raise Crash


def test_an_http_call_is_parked_and_the_sweep_sends_what_its_crash_left(store: TableStore, topic: Topic) -> None:
    """No delivery count: nobody redelivers it. Parked before its commit, it is sent by the
    sweep once it falls due — and only then (never racing the invocation's own send)."""
    with pytest.raises(Crash):
        consumer(store, CrashingSender(topic)).process(delivery("o-7", count=None))
    outbox = Outbox(store, topic, sweep_delay=NO_WAIT.outbox_sweep_delay)
    assert outbox.sweep(utcnow(), since=timedelta(hours=2)).parked == 0  # not due yet
    later = utcnow() + NO_WAIT.outbox_sweep_delay + timedelta(seconds=1)
    swept = outbox.sweep(later, since=timedelta(hours=2))
    assert (swept.parked, swept.sent, swept.failed) == (1, 1, 0)
    assert (topic.sent, copies(topic)) == (1, {"billing": 1, "shipping": 1})
    assert outbox.sweep(later, since=timedelta(hours=2)).parked == 0  # its index row is gone
    assert outbox_rows(store, "orders|o-7") == []


def test_a_parked_delivery_whose_send_fails_is_acknowledged_and_the_sweep_sends(
    store: TableStore, topic: Topic
) -> None:
    """The broker's last delivery: a failed send must not dead-letter a committed order."""
    topic.fail_before = 1
    result = consumer(store, topic).process(delivery("o-8", count=10))
    assert (result.outcome, result.acknowledge, topic.sent) == (Outcome.PROCESSED, True, 0)
    swept = Outbox(store, topic).sweep(utcnow() + timedelta(minutes=11), since=timedelta(hours=2))
    assert (swept.sent, topic.sent, topic.dropped_by_detection) == (1, 1, 0)


def test_a_parked_delivery_that_sent_its_messages_leaves_the_sweep_nothing(store: TableStore, topic: Topic) -> None:
    """Parked before its commit, it takes its index row back once its own send succeeded: the
    sweep's work follows the sends that failed, not the traffic."""
    c = consumer(store, topic)
    for order in ("o-9", "o-10"):
        assert c.process(delivery(order, count=None)).outcome is Outcome.PROCESSED
    assert c.process(delivery("o-9", count=None)).outcome is Outcome.DUPLICATE  # a caller's retry
    later = utcnow() + timedelta(minutes=11)
    assert store.read_entities(DUE + f"{later:%Y%m%d%H}", "", 10) == []
    swept = Outbox(store, topic).sweep(later, since=timedelta(hours=2))
    assert (swept.parked, swept.sent, topic.sent) == (0, 0, 2)


def test_the_sweep_reads_the_hours_since_its_cursor_whatever_the_table_holds(store: TableStore, topic: Topic) -> None:
    outbox = Outbox(store, topic)
    now = utcnow()
    first = outbox.sweep(now, since=timedelta(hours=5))
    assert first.reads == 1 + 6  # the cursor, then each hour from 5 h ago to now
    c = consumer(store, topic)
    for i in range(150):  # a bigger table: its size is never read
        c.process(delivery(f"bulk-{i}"))
    again = outbox.sweep(now + timedelta(minutes=1), since=timedelta(hours=5))
    assert again.reads <= 1 + 2 and again.parked == 0  # the cursor moved to the current hour
    assert [e.name for e in store.read_entities(DUE + "cursor", "", 10)] == ["cursor"]


def test_a_handler_that_sends_without_a_sender_is_a_bug_never_a_lost_message(store: TableStore) -> None:
    result = consumer(store, None).process(delivery("o-10"))
    assert (result.outcome, result.reason) == (Outcome.TRANSIENT, "handler_error")
    assert store.get(c_key := IdempotentConsumer("orders", store, accept, config=NO_WAIT).identify(delivery("o-10"))[0],
                     "orders|o-10") is None, c_key  # nothing committed  # fmt: skip


# -- through an app: items → the items topic → item-subscriber ------------------------------


def test_the_app_publishes_each_item_and_its_subscriber_acts_once(azurite: Azurite) -> None:
    """The test app's items (queue, ITEMS_TOPIC set) commits the item and ItemRecorded and
    sends it with the app's shared sender; the subscription gets one copy and item-subscriber
    records the item once, however often each hop repeats."""
    topic = Topic("items", {"subscriber": PeekLockQueue(60, 10, 0)})
    sent = item("e2e-1", 12.5)
    body = json.dumps(sent).encode()
    with fresh_app(azurite, ITEMS_TOPIC="items"), using_sender(topic):
        topic.lose_ack = 1  # the first send's answer is lost: sent again, dropped by detection
        assert queue_consumer().process(Delivery(body, message_id="e2e-1", delivery_count=1)).reason == (
            "dispatch_failed")  # fmt: skip
        for count in (2, 3):  # the redelivery re-sends; a lost completion redelivers once more
            assert queue_consumer().process(Delivery(body, message_id="e2e-1", delivery_count=count)).acknowledge
        assert (topic.sent, topic.dropped_by_detection) == (1, 1)
        [copy] = ready_messages(topic.subscriptions["subscriber"])
        assert json.loads(copy.body) == sent
        outcomes = [subscriber_consumer().process(Delivery(copy.body, message_id=copy.message_id,
                                                           delivery_count=n)).outcome
                    for n in (1, 2)]  # a duplicate delivery at this hop too  # fmt: skip
        assert outcomes == [Outcome.PROCESSED, Outcome.DUPLICATE]
        store = queue_consumer().store
        assert effects_by_item(store, "e2e-1") == {"e2e-1": {"item": 1, "posting": 1}}
        assert effects_by_item(store, "e2e-1", "item-subscriber") == {"e2e-1": {"item": 1, "posting": 1}}
        assert len(store.read_entities("items|e2e-1", ROWS, 10)) == 0


def test_a_servicebus_message_carries_the_outbox_id_properties_and_session() -> None:
    """The wire fields, built by the real azure-servicebus code (no namespace needed); the
    send itself needs one: the next test (OUTBOX_TEST_SERVICEBUS_NAMESPACE) makes a real send."""
    from shared.idempotency.functions._senders import to_servicebus

    wire = to_servicebus(Outgoing("order-events", {"orderId": "o-1", "é": 1}, "accepted", {"type": "OrderAccepted"},
                                  session_id="o-1", message_id="id-1"))  # fmt: skip
    assert (wire.message_id, wire.session_id, wire.content_type) == ("id-1", "o-1", "application/json")
    assert wire.application_properties == {"type": "OrderAccepted"}
    assert json.loads(str(wire)) == {"orderId": "o-1", "é": 1}


LIVE = os.environ.get("OUTBOX_TEST_SERVICEBUS_NAMESPACE"), os.environ.get("OUTBOX_TEST_TOPIC", "items")


@pytest.mark.skipif(not LIVE[0], reason="sends to a real namespace: set OUTBOX_TEST_SERVICEBUS_NAMESPACE "
                    "(<name>.servicebus.windows.net; OUTBOX_TEST_TOPIC, default items, with a "
                    "'subscriber' subscription) and sign in with a Data Sender + Receiver role")  # fmt: skip
def test_a_real_topic_takes_the_outbox_message_with_its_id_and_drops_the_re_send() -> None:
    from azure.identity import DefaultAzureCredential
    from azure.servicebus import ServiceBusClient

    from shared.idempotency.functions import ServiceBusSender

    namespace, topic_name = LIVE
    assert namespace is not None
    with ServiceBusClient(namespace, DefaultAzureCredential()) as service_bus:
        sender = ServiceBusSender(service_bus)
        message = Outgoing(topic_name, item("live-" + os.urandom(4).hex()), "published",
                           {"type": "ItemRecorded"}, message_id=os.urandom(16).hex())  # fmt: skip
        sender.send([message])
        sender.send([message])  # the same MessageId: the topic's duplicate detection drops it
        with service_bus.get_subscription_receiver(topic_name, "subscriber", max_wait_time=10) as receiver:
            got = [m for m in receiver.receive_messages(max_message_count=50, max_wait_time=10)
                   if m.message_id == message.message_id]  # fmt: skip
            for m in got:
                receiver.complete_message(m)
    assert len(got) == 1 and json.loads(str(got[0])) == message.body


# -- what a review found -------------------------------------------------------------------------


def test_an_outgoing_name_a_range_read_could_not_find_is_refused() -> None:
    from shared.idempotency import InvalidMessage
    from shared.idempotency.keys import DedupKey
    from shared.idempotency.outbox import rows

    with pytest.raises(InvalidMessage) as caught:
        rows(DedupKey("orders", "o-1"), [Outgoing("t", {}, "é" * 60)])  # encoded, it would be hashed
    assert caught.value.reason == "outgoing_names"


def test_a_last_delivery_parks_rows_an_earlier_one_left_whatever_its_handler_returns(
    store: TableStore, topic: Topic
) -> None:
    topic.fail_before = 1
    assert consumer(store, topic).process(delivery("o-11")).reason == "dispatch_failed"  # committed, unsent

    def silent(payload: Any, context: Context) -> Effects:  # this run sends nothing itself
        return Effects([Entity("order", {"id": payload["orderId"]})])

    topic.fail_before = 1
    last = IdempotentConsumer("orders", store, silent, config=NO_WAIT, sender=topic).process(delivery("o-11", 10))
    assert (last.outcome, last.acknowledge, topic.sent) == (Outcome.DUPLICATE, True, 0)
    swept = Outbox(store, topic).sweep(utcnow() + timedelta(minutes=11), since=timedelta(hours=2))
    assert (swept.sent, topic.sent) == (1, 1)


def test_a_sending_consumer_answers_hot_duplicates_from_its_cache_once_sent(store: TableStore, topic: Topic) -> None:
    calls = []

    def counted(payload: Any, context: Context) -> Effects:
        calls.append(payload["orderId"])
        return accept(payload, context)

    c = IdempotentConsumer("orders", store, counted, config=DedupConfig(transient_wait=timedelta(0), cache_size=10),
                           sender=topic)  # fmt: skip
    assert [c.process(delivery("o-12", n)).outcome for n in (1, 2, 3)] == [Outcome.PROCESSED, *[Outcome.DUPLICATE] * 2]
    assert (calls, topic.sent) == (["o-12"], 1)


def test_a_destination_that_stays_down_holds_neither_the_cursor_nor_the_reads(store: TableStore, topic: Topic) -> None:
    topic.fail_before = 1
    with pytest.raises(Crash):
        consumer(store, CrashingSender(topic)).process(delivery("o-13", count=None))  # parked
    outbox, now = Outbox(store, topic), utcnow()
    topic.fail_before = 1000  # down for good
    # An hourly sweep for two days (the timer runs every 5 min): each reads the cursor and the
    # hours since it, as the failing key moves along instead of pinning the cursor.
    reads = [outbox.sweep(now + timedelta(hours=h), since=timedelta(hours=1)).reads for h in range(1, 49)]
    assert max(reads) <= 3, reads
    topic.fail_before = 0
    swept = outbox.sweep(now + timedelta(hours=49), since=timedelta(hours=1))
    assert (swept.sent, topic.sent) == (1, 1)
