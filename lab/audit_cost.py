"""What the audit (shared/idempotency/audit/) costs, measured on Azurite:
``python -m lab.audit_cost [messages]``.

A consumer on a Table store records ``messages`` messages of a queue of the broker model (which
numbers them as Service Bus does), a tenth of them delivered twice (a duplicate's own record),
a few refused; a canary closes the window. Then one audit of that window, as the hourly timer
runs it (its checkpoint saved): the store requests it sends (its reads of the consumer's
facts, the checkpoint, the dead-letter records) and its peeks of the queue and of its DLQ,
reported per 10,000 messages. The facts are read a page of 1,000 at a time: on Azurite a page
is always full; the service may return shorter pages on a large table, so these counts are a
floor there. Peeks are per entity and window, and per 250 messages still in it (``held``: sent
after the window's messages were consumed, and left in the queue)."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

from lab.purge_cost import Counted
from shared.idempotency import Effects, Entity, IdempotentConsumer, InvalidMessage
from shared.idempotency.audit import Peeked, run
from shared.idempotency.config import DedupConfig
from shared.idempotency.facts import CANARY_PREFIX, CANARY_PROPERTY
from shared.idempotency.messages import Delivery
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import PeekLockQueue

PER = 10_000


class CountedPeeks:
    """The broker model's queue as the audit peeks it, counting the peeks."""

    def __init__(self, queue: PeekLockQueue) -> None:
        self.queue, self.peeks = queue, 0

    def peek(self, from_sequence: int, count: int) -> list[Peeked]:
        self.peeks += 1
        return self.queue.peek(from_sequence, count)

    def peek_dead_letters(self, from_sequence: int, count: int) -> list[Peeked]:
        self.peeks += 1
        return self.queue.peek_dead_letters(from_sequence, count)


def handler(payload: Any, context: Any) -> Effects:
    if payload.get("refuse"):
        raise InvalidMessage("bench", "refused")
    return Effects([Entity("order", payload)])


def measure(azurite: Azurite, messages: int, held: int = 0) -> dict[str, Any]:
    """The audit of a window of ``messages``, the consumer's checkpoint saved by an earlier one
    (the hourly timer's steady state), ``held`` more still in the queue."""
    target = Counted(azurite)
    try:
        queue = PeekLockQueue(60.0, 10, 0)
        flow = IdempotentConsumer("bench", target.store, handler, config=DedupConfig(cache_size=0))
        broker = CountedPeeks(queue)
        deliver(queue, flow, 10, "before")
        run(target.store, "bench", broker, settle=timedelta(0), keep=True)  # the checkpoint
        deliver(queue, flow, messages, "window")
        for i in range(held):  # sent, not consumed yet: in flight
            queue.send(f"held-{i}", json.dumps({"n": i}).encode())
        target.store._expiry.flush()
        target.requests, broker.peeks = 0, 0
        found = run(target.store, "bench", broker, settle=timedelta(0), keep=True)
        return {
            "messages": messages,
            "held": held,
            "received": found.received,
            "closes": found.closes,
            "store_requests": target.requests,
            "peeks": broker.peeks,
            "store_requests_per_10000": round(target.requests * PER / found.received, 2),
            "peeks_per_10000": round(broker.peeks * PER / found.received, 2),
        }
    finally:
        target.drop()


def deliver(queue: PeekLockQueue, flow: IdempotentConsumer, messages: int, run: str) -> None:
    """``messages`` sent and consumed, every 10th delivered twice (its lock lost after the
    commit), every 500th refused; then a canary, which closes the window."""
    for i in range(messages):
        queue.send(f"{run}-{i}", json.dumps({"n": i, "refuse": i % 500 == 0}).encode())
    queue.send(f"{CANARY_PREFIX}{run}", b"{}", {CANARY_PROPERTY: "bench"})
    while (lock := queue.receive(0)) is not None:
        m = lock.message
        delivery = Delivery(m.body, message_id=m.message_id, delivery_count=lock.delivery_count,
                            properties=m.properties, sequence=m.seq, enqueued_at=m.enqueued_at)  # fmt: skip
        flow.process(delivery)
        if m.seq % 10 == 0:
            flow.process(replace(delivery, delivery_count=2))
        assert queue.complete(lock)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("messages", nargs="?", type=int, default=PER)
    args = parser.parse_args(argv)
    logging.getLogger("idempotency").setLevel(logging.ERROR)  # the refusals are counted, not printed
    with Azurite() as azurite:
        print(json.dumps(measure(azurite, args.messages)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
