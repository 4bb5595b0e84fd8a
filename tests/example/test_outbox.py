"""The example's outbox, end to end: orders → order-events → billing + shipping (the
order_topic recipe), on Azurite and the local topic model (lab/topic.py). Moved from
tests/integration/test_outbox.py; the library's outbox is proven there on the test app."""

from __future__ import annotations

import json

import pytest

import recipes
from lab.topic import Topic
from shared.idempotency import Delivery, Outcome
from shared.idempotency.outbox import ROWS
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import PeekLockQueue


@pytest.fixture
def topic() -> Topic:
    queues = {name: PeekLockQueue(60, 10, 0) for name in ("billing", "shipping")}
    return Topic("order-events", queues)


# -- the example, end to end: orders → order-events → billing + shipping --------------------


def test_the_example_publishes_order_accepted_and_each_subscriber_acts_once(azurite: Azurite, topic: Topic) -> None:
    """orders (queue) commits the order and OrderAccepted; billing and shipping each get one
    copy and record one invoice and one pick list, however often each hop repeats."""
    order_topic = recipes.module("order_topic")
    billing_consumer, shipping_consumer = order_topic.billing_consumer, order_topic.shipping_consumer
    from consumers.orders import queue_consumer
    from shared.idempotency.testing import using_sender
    from tests.functions import fresh_app, ready_messages

    order = {"orderId": "e2e-1", "customerId": "c-1", "amount": 12.5, "currency": "EUR",
             "items": [{"sku": "A", "quantity": 1}]}  # fmt: skip
    body = json.dumps(order).encode()
    with fresh_app(azurite, ORDER_ACCEPTED_TOPIC="order-events"), using_sender(topic):
        topic.lose_ack = 1  # the first send's answer is lost: sent again, dropped by detection
        assert queue_consumer().process(Delivery(body, message_id="e2e-1", delivery_count=1)).reason == (
            "dispatch_failed")  # fmt: skip
        for count in (2, 3):  # the redelivery re-sends; a lost completion redelivers once more
            assert queue_consumer().process(Delivery(body, message_id="e2e-1", delivery_count=count)).acknowledge
        assert (topic.sent, topic.dropped_by_detection) == (1, 1)
        for name, build in (("billing", billing_consumer), ("shipping", shipping_consumer)):
            [copy] = ready_messages(topic.subscriptions[name])
            assert json.loads(copy.body) == order
            outcomes = [build().process(Delivery(copy.body, message_id=copy.message_id, delivery_count=n)).outcome
                        for n in (1, 2)]  # a duplicate delivery at this hop too  # fmt: skip
            assert outcomes == [Outcome.PROCESSED, Outcome.DUPLICATE]
        store = queue_consumer().store
        assert len(store.read_entities("orders|e2e-1", ROWS, 10)) == 0
