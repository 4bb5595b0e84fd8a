"""The ``queue`` recipe (recipes/returns.py) on the real Azurite queue and table services, its
messages delivered by a listener that runs as the Functions host's (lab/queue_host.py): a
redelivery, a producer's retry (a new queue message), a crash before the delete, an invalid
message, a handler that keeps failing, a store outage waited out; exact counts each time."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

import recipes
from lab.queue_chaos import run as queue_chaos
from lab.queue_chaos import violations
from lab.queue_host import POISON_LOG, QueueHost, queue_client
from shared.idempotency import Delivery, Outcome, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.testing import entities, wrapped_handler
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash
from tests.functions import fresh_app, store_down, user_function

returns = recipes.module("returns")


@pytest.fixture(scope="module")
def queues() -> Iterator[Azurite]:
    with Azurite(service="queue") as emulator:
        yield emulator


@pytest.fixture
def app(azurite: Azurite, queues: Azurite) -> Iterator[str]:
    """The app on fresh tables and a fresh queue: yields the queue's name."""
    name = "returns-" + uuid.uuid4().hex[:8]
    with fresh_app(azurite, RETURNS_QUEUE=name, StorageQueueConnection=queues.connection_string):
        shared_store().create_tables()
        yield name


@pytest.fixture
def outcomes(app: str) -> Iterator[list[tuple[str, Outcome]]]:
    """Every result the returns consumer gives, (returnId, outcome), as the function gets them."""
    found: list[tuple[str, Outcome]] = []
    consumer = returns.returns_consumer()
    process_batch = consumer.process_batch

    def recorded(deliveries: Sequence[Delivery]) -> list[Result]:
        results = process_batch(deliveries)
        found.extend((r.key.id if r.key else "", r.outcome) for r in results)
        return results

    consumer.process_batch = recorded  # type: ignore[method-assign]
    yield found


def a_return(return_id: str, amount: float = 12.5) -> dict[str, Any]:
    return {"returnId": return_id, "orderId": "o-1", "amount": amount}


def host(queues: Azurite, name: str, **options: Any) -> QueueHost:
    found = QueueHost(queues.connection_string, name, user_function("order_returns"), **options)
    found.create_queues()
    return found


def send(queues: Azurite, name: str, *bodies: dict[str, Any] | bytes) -> None:
    sender = queue_client(queues.connection_string, name)
    for body in bodies:
        sender.send_message(body if isinstance(body, bytes) else json.dumps(body).encode())


def drain(listener: QueueHost, timeout: float = 30.0) -> None:
    """Poll until the queue is empty (no message visible nor leased), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if listener.poll() == 0:
            if not listener.queue.get_queue_properties().approximate_message_count:
                return
            time.sleep(0.1)  # a leased message comes back when its lease lapses
    raise AssertionError("messages left in the queue")


def applied() -> Counter[str]:
    return Counter(e["returnId"] for e in entities(shared_store(), "return"))


def poisoned(listener: QueueHost) -> list[bytes]:
    return [bytes(m.content) for m in listener.poison.receive_messages()]


def test_a_producers_retry_is_a_new_queue_message_and_one_return(
    queues: Azurite, app: str, outcomes: list[tuple[str, Outcome]]
) -> None:
    listener = host(queues, app)
    send(queues, app, a_return("r-1"), a_return("r-1"), a_return("r-2"))
    drain(listener)
    assert Counter(outcomes) == Counter({("r-1", Outcome.PROCESSED): 1, ("r-1", Outcome.DUPLICATE): 1,
                                         ("r-2", Outcome.PROCESSED): 1})  # fmt: skip
    assert applied() == Counter({"r-1": 1, "r-2": 1}) and shared_store().dead_letters("returns") == []
    assert (listener.tally.invocations, listener.tally.deleted, poisoned(listener)) == (3, 3, [])


def test_a_crash_before_the_delete_redelivers_and_the_redelivery_is_a_duplicate(queues: Azurite, app: str) -> None:
    crashed: list[str] = []

    def lose_first_delete(stage: str, message: Any) -> None:
        if stage == "delete" and not crashed:
            crashed.append(message.id)
            raise Crash(stage)

    listener = host(queues, app, lease=timedelta(seconds=1), faults=lose_first_delete)
    send(queues, app, a_return("r-1"))
    drain(listener)
    assert applied() == Counter({"r-1": 1})
    assert (listener.tally.invocations, listener.tally.lost_deletes, listener.tally.deleted) == (2, 1, 1)


def test_an_invalid_message_is_dead_lettered_at_its_first_dequeue_and_never_poisoned(queues: Azurite, app: str) -> None:
    listener = host(queues, app)
    send(queues, app, {"returnId": "r-bad", "amount": -1}, b"not json")
    drain(listener)
    reasons = sorted(d.reason for d in shared_store().dead_letters("returns"))
    assert reasons == ["invalid_json", "schema_violation"]
    assert [d.delivery_count for d in shared_store().dead_letters("returns")] == [1, 1]
    assert (listener.tally.invocations, listener.tally.deleted, poisoned(listener), applied()) == (2, 2, [], Counter())


def test_a_handler_that_keeps_failing_is_recorded_on_its_last_dequeue_then_poisoned(
    queues: Azurite, app: str, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(handler: Any) -> Any:
        def handle(body: Any, context: Any) -> Any:
            raise RuntimeError("a bug")

        return handle

    listener = host(queues, app)
    send(queues, app, a_return("r-1"))
    with wrapped_handler(returns.returns_consumer(), failing):
        for dequeue in range(1, 5):  # released at once (the listener's visibility timeout: 0)
            assert listener.poll() == 1 and shared_store().dead_letters("returns") == [], dequeue
        drain(listener)
    [record] = shared_store().dead_letters("returns")
    assert (record.reason, record.delivery_count) == ("handler_error", 5)
    assert listener.tally.invocations == 5 and listener.tally.released == 4
    assert [json.loads(body) for body in poisoned(listener)] == [a_return("r-1")]
    assert applied() == Counter()
    assert POISON_LOG.format(5, f"{app}-poison") in caplog.messages  # what the poison-queue alert finds


def test_a_store_outage_is_waited_out_inside_the_dequeue(queues: Azurite, azurite: Azurite) -> None:
    """Down for a second, waited for up to 30 s (DEDUP_TRANSIENT_WAIT): one dequeue, one return."""
    name = "returns-" + uuid.uuid4().hex[:8]
    with fresh_app(azurite, RETURNS_QUEUE=name, StorageQueueConnection=queues.connection_string,
                   DEDUP_TRANSIENT_WAIT="PT30S"):  # fmt: skip
        shared_store().create_tables()
        listener = host(queues, name)
        send(queues, name, a_return("r-1"))
        outage = store_down(returns.returns_consumer())
        outage.__enter__()
        threading.Timer(1.0, outage.__exit__, args=(None, None, None)).start()
        drain(listener)
        assert applied() == Counter({"r-1": 1})
        assert (listener.tally.invocations, listener.tally.released, poisoned(listener)) == (1, 0, [])


@pytest.mark.long("hundreds of messages under faults")
def test_chaos_competing_instances_crashes_lost_deletes_and_an_outage() -> None:
    """``make chaos`` runs 2,000 returns with a 30 s outage; this, a short one. Seed 7 crashes an
    instance at its 37th invocation and loses the 11th delete (a random stream per stage)."""
    report = queue_chaos(messages=300, instances=4, crash_rate=0.01, lost_delete_rate=0.02, outage=3.0, seed=7)
    assert violations(report) == {}, report
    assert report["applied"] == 300 and report["crashes"] > 0 and report["lost_deletes"] > 0, report
