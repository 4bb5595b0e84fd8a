"""The outbox under fire: orders → order-events → billing + shipping, at least once at every
hop, with competing workers and faults at each one — store faults (503, timeouts, answers
lost, crashes before and after the commit), sends that fail before reaching the topic or
whose answer is lost, crashes between the commit and the send, lost completions and lock
expiries, and producer duplicates. Then the real store is read: every order has one order
record, one invoice and one pick list; nothing is left in a broker's dead-letter queue.

It reports what the duplicates became: re-sends dropped by the topic's duplicate detection,
and copies that got past it (its window is short here) and were caught by the subscribers'
dedup.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import recipes
from consumers import orders
from lab import runtimes, workload
from lab.findings import Findings
from lab.harness import RunConfig, Timing, _attach_store, _configure, _counting_outcomes
from lab.topic import SendFailed, Topic
from shared.idempotency import Outgoing
from shared.idempotency.errors import DedupError
from shared.idempotency.messages import utcnow
from shared.idempotency.outbox import ROWS, Outbox
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing import reset, using_sender
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import Lock, PeekLockQueue
from shared.idempotency.testing.delivery import deliver_until_drained
from shared.idempotency.testing.faults import Crash, FaultPlan

order_topic = recipes.module("order_topic")

HOPS = ("orders", "billing", "shipping")
SEND_FAULTS = ("send_failed", "send_answer_lost", "crash_before_send")


@dataclass(frozen=True)
class ChainConfig:
    messages: int = 300
    workers: int = 8
    dup_rate: float = 0.3
    fault_rate: float = 0.05  # store requests and settlements
    send_fault_rate: float = 0.15  # sends
    topic_window: int = 16  # MessageIds the topic remembers: short, so that some re-sends get past it
    lock_duration: float = 1.0
    seed: int = 1


@dataclass
class ChainReport(Findings):
    orders: int = 0
    deliveries: Counter[str] = field(default_factory=Counter)
    sent_to_topic: int = 0
    dropped_by_detection: int = 0
    caught_by_dedup: int = 0  # copies past detection, beyond one per order and subscription
    swept: int = 0
    double: int = 0
    lost: int = 0
    left_in_outbox: int = 0
    broker_dead_lettered: int = 0


class FaultySender:
    """In front of the topic: a send fails before it arrives, arrives with its answer lost,
    or the process dies between the commit and the send."""

    def __init__(self, topic: Topic, rate: float, seed: int, injected: Counter[str]) -> None:
        self.topic, self.rate, self.injected = topic, rate, injected
        self._rng, self._mutex = random.Random(seed), threading.Lock()

    def send(self, messages: Sequence[Outgoing]) -> None:
        with self._mutex:
            fault = self._rng.choice(SEND_FAULTS) if self._rng.random() < self.rate else None
            if fault:
                self.injected[fault] += 1
        if fault == "crash_before_send":
            raise Crash
        if fault == "send_failed":
            raise SendFailed("injected: the send did not reach the topic")
        self.topic.send(messages)
        if fault == "send_answer_lost":
            raise SendFailed("injected: the topic took it, its answer was lost")


def _swept(outbox: Outbox, now: datetime) -> int:
    """The sweep timer's runs until one ends (what it sent): a run that died (its instance
    crashed, the store failed it) is followed by the next, as the schedule would."""
    for _ in range(100):
        try:
            return outbox.sweep(now, since=timedelta(hours=1)).sent
        except (Crash, DedupError):
            continue
    raise RuntimeError("100 runs of the outbox sweep in a row died")


def run_chain(config: ChainConfig, azurite: Azurite) -> ChainReport:
    report, started = ChainReport(), time.monotonic()
    logical = workload.generate(config.messages, config.seed, mismatch_rate=0.0, invalid_rate=0.0)
    timing = Timing.of(RunConfig(lock_duration=config.lock_duration))
    queues = {hop: PeekLockQueue(config.lock_duration, timing.max_deliveries, 0, timing.lock_renewal) for hop in HOPS}
    accepted = {m.key for i, body in workload.sends(logical, config.dup_rate, config.seed)
                if queues["orders"].send((m := logical[i]).message_id, body)}  # fmt: skip
    report.orders = len(accepted)
    topic = Topic("order-events", {h: queues[h] for h in HOPS[1:]}, duplicate_window=config.topic_window)
    plan = FaultPlan(config.fault_rate, config.seed, config.lock_duration)
    sender = FaultySender(topic, config.send_fault_rate, config.seed + 7, plan.injected)
    table = "chain" + uuid.uuid4().hex[:12]
    os.environ.update(DEDUP_STORAGE_CONNECTION=azurite.connection_string, DEDUP_TABLE=table,
                      DEDUP_DEADLETTER_TABLE=table + "dl", ORDER_ACCEPTED_TOPIC=topic.name)  # fmt: skip
    _configure(timing, None)
    running = threading.local()
    with ExitStack() as stack:
        stack.callback(os.environ.pop, "ORDER_ACCEPTED_TOPIC", None)  # the runs after this one send nothing
        stack.enter_context(using_sender(sender))
        reset()
        consumers = {"orders": orders.queue_consumer(), "billing": order_topic.billing_consumer(),
                     "shipping": order_topic.shipping_consumer()}  # fmt: skip
        for consumer in consumers.values():
            store = _attach_store(consumer, azurite, plan, True, TableStore)  # a clean view for the checks
        runtime = stack.enter_context(runtimes.started("process"))
        stack.enter_context(_counting_outcomes(report.outcomes))
        for hop in HOPS:

            def lose_lock(hop: str = hop) -> None:  # this hop's, while a delivery runs (the sweep holds none)
                if hasattr(running, "lock"):
                    queues[hop].lose(running.lock)

            plan.lose_lock = lose_lock

            def deliver(lock: Lock, hop: str = hop) -> None:
                running.lock = lock
                runtime.servicebus(hop, lock.message.body, lock.message.message_id, lock.delivery_count)

            deliver_until_drained(queues[hop], deliver, plan, config.workers)
            if hop == "orders":  # what parked last deliveries left: the timer, once it falls due
                later = utcnow() + consumers["orders"].outbox(sender).sweep_delay + timedelta(seconds=1)
                report.swept = _swept(consumers["orders"].outbox(topic), later)
        report.deliveries = Counter({hop: queue.deliveries for hop, queue in queues.items()})
    report.faults = plan.injected
    report.sent_to_topic, report.dropped_by_detection = topic.sent, topic.dropped_by_detection
    report.caught_by_dedup = sum(queues[h].sent for h in HOPS[1:]) - 2 * len(accepted)
    _verify(report, accepted, store, queues)
    report.seconds = time.monotonic() - started
    return report


def _verify(
    report: ChainReport, accepted: set[str | None], store: DedupStore, queues: dict[str, PeekLockQueue]
) -> None:
    found: Counter[tuple[str, str]] = Counter()
    for item in store.scan():
        if item.entity in ("order", "invoice", "picklist") and "orderId" in item.data:
            found[(item.entity, str(item.data["orderId"]))] += 1
        elif item.entity is not None and item.entity.startswith(ROWS):
            report.left_in_outbox += 1
    for order in sorted(o for o in accepted if o is not None):
        for entity in ("order", "invoice", "picklist"):
            times = found[(entity, order)]
            if times > 1:
                report.double += times - 1
                report.violations.append(f"{entity} {times} times: {order}")
            elif times == 0:
                report.lost += 1
                report.violations.append(f"no {entity}: {order}")
    if report.left_in_outbox:
        report.violations.append(f"{report.left_in_outbox} outgoing messages never sent")
    report.broker_dead_lettered = sum(len(q.dead) for q in queues.values())
    report.violations += [f"left in {hop}'s dead-letter queue: {m.message_id}" for hop, q in queues.items()
                          for m in q.dead]  # fmt: skip
    del report.violations[50:]
