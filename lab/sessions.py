"""Service Bus sessions under fire: the `order_status` consumer (versioned state, a session
per order) fed by a session queue with Service Bus semantics, on Azurite, with faults.

What it models: a receiver accepts one free session at a time and holds its session lock;
it receives the session's messages in order, one at a time; abandon puts the message back
at the head of its session at once (delivery count + 1); a crash or a lost session lock
releases the session with its head message unsettled, and another receiver accepts it.
Without sessions (``sessions=False``: competing consumers on one queue), messages of one
order may be applied out of order — the twin that shows what sessions are for.

Counts: no version applied after a newer one of its order (``stale`` = 0), none twice, and
each order's final status its last version's.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass

import recipes
from lab.findings import Findings
from lab.harness import _attach_store, _counting_outcomes
from shared.idempotency import Delivery, IdempotentConsumer
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import reset
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash, FaultPlan

status_consumer = recipes.module("order_status").status_consumer

STATUSES = ("placed", "paid", "packed", "shipped", "delivered")


@dataclass(frozen=True)
class SessionConfig:
    orders: int = 60
    workers: int = 8
    dup_rate: float = 0.2  # a producer's retry, right behind the original in its session
    fault_rate: float = 0.05
    sessions: bool = True
    seed: int = 1


@dataclass
class SessionReport(Findings):
    messages: int = 0
    deliveries: int = 0
    session_releases: int = 0  # a crash or a lost session lock: another receiver takes over
    wrong_final: int = 0
    dead_lettered: int = 0


@dataclass
class _Message:
    body: bytes
    message_id: str
    count: int = 0


class _SessionQueue:
    def __init__(self, sessions: bool, max_deliveries: int = 10) -> None:
        self._cv = threading.Condition()
        self._queues: dict[str, deque[_Message]] = {}
        self._locked: set[str] = set()
        self._sessions, self._max = sessions, max_deliveries
        self.dead: list[str] = []

    def send(self, session: str, body: bytes, message_id: str) -> None:
        key = session if self._sessions else "all"  # no sessions: one queue, competing consumers
        self._queues.setdefault(key, deque()).append(_Message(body, message_id))

    def accept(self) -> str | None:
        with self._cv:
            free = [s for s, q in self._queues.items() if q and (s not in self._locked or not self._sessions)]
            if not free:
                return None
            session = random.choice(free)
            if self._sessions:
                self._locked.add(session)
            return session

    def receive(self, session: str) -> _Message | None:
        with self._cv:
            queue = self._queues[session]
            if not queue:
                return None
            # In a session, the head until it is settled; without, whoever asks takes the next.
            head = queue[0] if self._sessions else queue.popleft()
            head.count += 1
            return head

    def settle(self, session: str, message: _Message, ok: bool) -> None:
        with self._cv:
            queue = self._queues[session]
            if not ok and message.count >= self._max:
                self.dead.append(message.message_id)
            if self._sessions and (ok or message.count >= self._max):
                queue.popleft()
            elif not self._sessions and not ok and message.count < self._max:
                queue.append(message)  # back, behind newer versions of its order

    def release(self, session: str) -> None:
        with self._cv:
            self._locked.discard(session)

    def drained(self) -> bool:
        with self._cv:
            return not any(self._queues.values())


def run_sessions(config: SessionConfig, azurite: Azurite) -> SessionReport:
    report, started, rng = SessionReport(), time.monotonic(), random.Random(config.seed)
    queue = _SessionQueue(config.sessions)
    for _ in range(config.orders):
        order = f"o-{uuid.uuid4().hex[:8]}"
        for version, status in enumerate(STATUSES, start=1):
            body = json.dumps({"orderId": order, "status": status, "version": version}).encode()
            for _ in range(1 + (rng.random() < config.dup_rate)):
                queue.send(order, body, f"{order}:{version}")
                report.messages += 1
    plan = FaultPlan(config.fault_rate, config.seed, 1.0)
    table = "sess" + uuid.uuid4().hex[:12]
    os.environ.update(DEDUP_STORAGE_CONNECTION=azurite.connection_string, DEDUP_TABLE=table,
                      DEDUP_DEADLETTER_TABLE=table + "dl", DEDUP_TRANSIENT_WAIT="PT0S")  # fmt: skip
    with ExitStack() as stack:
        reset()
        consumer = status_consumer()
        store = _attach_store(consumer, azurite, plan, True, TableStore)
        stack.enter_context(_counting_outcomes(report.outcomes))
        threads = [threading.Thread(target=_receiver, args=(queue, consumer, report, random.Random(config.seed + i)))
                   for i in range(config.workers)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    report.faults = plan.injected
    report.dead_lettered = len(queue.dead)
    final = {str(item.data["orderId"]): str(item.data["status"]) for item in store.scan() if item.entity == "status"}
    report.wrong_final = sum(status != STATUSES[-1] for status in final.values()) + config.orders - len(final)
    expected = config.orders * len(STATUSES)
    # In order: no version ever arrives after a newer one (stale). Each at most once: a version
    # whose write was answered but lost is read back as the same version (duplicate), never twice.
    if report.outcomes["stale"] or report.outcomes["processed"] > expected:
        report.violations.append(f"out of order: {report.outcomes['stale']} stale, {report.outcomes['processed']} "
                                 f"applied of {expected} versions")  # fmt: skip
    if report.wrong_final or report.dead_lettered:
        report.violations.append(f"{report.wrong_final} orders not at their last status, {report.dead_lettered} "
                                 "dead-lettered")  # fmt: skip
    report.seconds = time.monotonic() - started
    return report


def _receiver(queue: _SessionQueue, consumer: IdempotentConsumer, report: SessionReport, rng: random.Random) -> None:
    while not queue.drained():
        session = queue.accept()
        if session is None:
            time.sleep(0.002)
            continue
        try:
            while (message := queue.receive(session)) is not None:
                report.deliveries += 1
                try:
                    result = consumer.process(Delivery(message.body, message_id=message.message_id,
                                                       delivery_count=message.count))  # fmt: skip
                except Crash:
                    queue.settle(session, message, ok=False)  # unsettled; the session lock lapses
                    report.session_releases += 1
                    break
                queue.settle(session, message, ok=result.acknowledge)
                if not result.acknowledge or rng.random() < 0.02:  # abandoned, or the session lock was lost
                    report.session_releases += not result.acknowledge
                    break
        finally:
            queue.release(session)
