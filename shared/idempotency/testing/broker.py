"""A delivery simulator with Service Bus peek-lock semantics. A test tool, not a broker.

What it models, as the service does it:
- a lock per delivery, renewed by the host while the function runs (up to
  ``maxAutoLockRenewalDuration``), never after the process died: then it lapses after
  the lock duration and another worker receives the message; a lock can also be lost
  while the function still runs (``lose``), and completing with a lost lock fails;
- abandon → the message is available again **at once, in its place** (ordered by its
  sequence number, ahead of later messages), delivery count + 1 — Service Bus applies
  no delay;
- ``max_delivery_count`` → the dead-letter queue with a reason;
- send-side duplicate detection over a bounded history of MessageIds (Service Bus uses a
  time window), which drops producer retries that fall inside it and lets later ones through;
- a sequence number per accepted message, gap-free and increasing (a dropped duplicate takes
  none), its enqueued time, and peeking by sequence number, on the queue (active or locked) and
  on its dead-letter queue, where a message keeps its number (``shared.idempotency.audit``'s
  ``Broker``).

Nothing is ever resubmitted from the dead-letter queue unless a caller says so: that is an
operator's act, reported apart — with the template's tool (``dead_letter_queue``, as
shared.idempotency.resend uses Service Bus: a new MessageId, the key in a property) or with
another tool that sends each message again under its own MessageId (``resubmit_dead_letters``),
which duplicate detection drops inside its window, as the service does.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.idempotency.audit import Peeked
from shared.idempotency.resend import Parked


@dataclass
class QueuedMessage:
    seq: int
    message_id: str | None
    body: bytes
    delivery_count: int = 0
    token: int = 0  # the current lock's token; 0 when not locked
    locked_until: float = 0.0
    dead_reason: str | None = None
    properties: dict[str, str] = field(default_factory=dict)  # application properties
    enqueued_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __lt__(self, other: QueuedMessage) -> bool:  # the ready heap's order: sequence numbers
        return self.seq < other.seq


@dataclass(frozen=True)
class Lock:
    message: QueuedMessage
    token: int
    delivery_count: int


class PeekLockQueue:
    def __init__(
        self, lock_duration: float, max_delivery_count: int, duplicate_window: int, lock_renewal: float = 0.0,
        first_sequence: int = 1,
    ) -> None:  # fmt: skip
        """``first_sequence``: the number the next message gets (an entity long in use numbers in the millions)."""
        self.lock_duration = lock_duration
        self.lock_renewal = lock_renewal  # the host's maxAutoLockRenewalDuration
        self.max_delivery_count = max_delivery_count
        self.duplicate_window = duplicate_window
        self._cv = threading.Condition()
        self._ready: list[QueuedMessage] = []  # a heap by sequence number
        self._scheduled: list[tuple[float, int, QueuedMessage]] = []  # a heap by when each is enqueued
        self._locked: dict[int, QueuedMessage] = {}
        self._history: OrderedDict[str, None] = OrderedDict()
        self._seq = itertools.count(first_sequence)
        self._tokens = itertools.count(1)
        self.dead: list[QueuedMessage] = []
        self.sent = self.accepted = self.dropped_by_detection = self.deliveries = self.completed = 0
        self.lock_expiries = self.locks_lost = 0

    # -- producer side ---------------------------------------------------------------

    def send(self, message_id: str | None, body: bytes, properties: dict[str, str] | None = None,
             scheduled_in: float = 0.0) -> bool:  # fmt: skip
        """False when duplicate detection dropped the send (as Service Bus does). ``scheduled_in``
        seconds: a scheduled message, numbered now and enqueued (received, its enqueued time)
        then; peeked meanwhile, as Service Bus shows it."""
        with self._cv:
            self.sent += 1
            if message_id is not None and self.duplicate_window > 0:
                if message_id in self._history:
                    self.dropped_by_detection += 1
                    return False
                self._history[message_id] = None
                if len(self._history) > self.duplicate_window:
                    self._history.popitem(last=False)
            message = QueuedMessage(next(self._seq), message_id, body, properties=properties or {})
            if scheduled_in > 0:
                message.enqueued_at += timedelta(seconds=scheduled_in)
                heapq.heappush(self._scheduled, (time.monotonic() + scheduled_in, message.seq, message))
            else:
                heapq.heappush(self._ready, message)
            self.accepted += 1
            self._cv.notify()
            return True

    def resubmit_dead_letters(self) -> int:
        """What another tool does (Service Bus Explorer's resend): every dead-lettered message
        sent again under its own MessageId and taken from the DLQ; how many the queue accepted
        (inside the detection window, none: dropped, silently)."""
        with self._cv:
            dead, self.dead = self.dead, []
            return sum(self.send(m.message_id, m.body, m.properties) for m in dead)

    def dead_letter_queue(self) -> DeadLetters:
        """The DLQ as the template's resubmission takes it (shared.idempotency.resend)."""
        return DeadLetters(self)

    # -- consumer side ---------------------------------------------------------------

    def receive(self, timeout: float) -> Lock | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                now = time.monotonic()
                self._expire_locks(now)
                while self._scheduled and self._scheduled[0][0] <= now:  # its time came: enqueued
                    heapq.heappush(self._ready, heapq.heappop(self._scheduled)[2])
                if self._ready:
                    message = heapq.heappop(self._ready)
                    message.delivery_count += 1
                    message.token = next(self._tokens)
                    # renewed by the host while the function runs, up to its renewal limit
                    message.locked_until = now + max(self.lock_duration, self.lock_renewal)
                    self._locked[message.seq] = message
                    self.deliveries += 1
                    return Lock(message, message.token, message.delivery_count)
                if not (self._locked or self._scheduled) or now >= deadline:
                    return None
                next_change = min([m.locked_until for m in self._locked.values()] + [t for t, _, _ in self._scheduled])
                self._cv.wait(max(0.001, min(deadline, next_change) - now))

    def complete(self, lock: Lock) -> bool:
        """False when the lock was lost (expired or superseded): the message stays."""
        with self._cv:
            message = lock.message
            if message.token != lock.token or message.locked_until <= time.monotonic():
                self.locks_lost += 1
                return False
            del self._locked[message.seq]
            message.token = 0
            self.completed += 1
            self._cv.notify_all()
            return True

    def abandon(self, lock: Lock, why: str = "", *, delay: float = 0.0) -> None:
        """Available again at once (Service Bus), or after ``delay`` seconds (a push service's
        retry schedule: Event Grid)."""
        with self._cv:
            if lock.message.token == lock.token:
                self._unlock(lock.message, f"abandoned: {why}" if why else "abandoned", delay)

    def crashed(self, lock: Lock) -> None:
        """The holder died: nobody renews its lock, which lapses after the lock duration."""
        with self._cv:
            if lock.message.token == lock.token:
                lock.message.locked_until = min(lock.message.locked_until, time.monotonic() + self.lock_duration)
                self._cv.notify_all()

    def lose(self, lock: Lock) -> None:
        """The lock is lost while its holder still runs (a renewal failed): the message is
        available to another worker now; the holder's completion will fail."""
        with self._cv:
            if lock.message.token == lock.token:
                self.lock_expiries += 1
                self._unlock(lock.message, "lock lost")

    def peek(self, from_sequence: int, count: int) -> list[Peeked]:
        """The messages still in the queue (locked or not, scheduled) from ``from_sequence`` on, in order."""
        with self._cv:
            held = [*self._ready, *self._locked.values(), *(m for _, _, m in self._scheduled)]
        return _peeked(held, from_sequence, count)

    def peek_dead_letters(self, from_sequence: int, count: int) -> list[Peeked]:
        with self._cv:
            return _peeked(self.dead, from_sequence, count, dead_lettered=True)

    def drained(self) -> bool:
        with self._cv:
            self._expire_locks(time.monotonic())
            return not self._ready and not self._locked and not self._scheduled

    def _expire_locks(self, now: float) -> None:
        for message in [m for m in self._locked.values() if m.locked_until <= now]:
            self.lock_expiries += 1
            self._unlock(message, "lock expired")

    def _unlock(self, message: QueuedMessage, why: str, delay: float = 0.0) -> None:
        del self._locked[message.seq]
        message.token = 0
        if message.delivery_count >= self.max_delivery_count:
            message.dead_reason = f"MaxDeliveryCountExceeded (last: {why})"
            self.dead.append(message)
        elif delay > 0:
            heapq.heappush(self._scheduled, (time.monotonic() + delay, message.seq, message))
            self._cv.notify_all()
        else:
            heapq.heappush(self._ready, message)  # in its place: no delay, ahead of later messages
        self._cv.notify_all()


class DeadLetters:
    """A queue's DLQ as ``shared.idempotency.resend.DeadLetterQueue``."""

    def __init__(self, queue: PeekLockQueue) -> None:
        self._queue = queue

    def receive(self, count: int) -> list[Parked]:
        with self._queue._cv:
            return [Parked(m.seq, m.enqueued_at, m.message_id, m.body, dict(m.properties), m)
                    for m in self._queue.dead[:count]]  # fmt: skip

    def send(self, body: bytes, message_id: str, properties: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        self._queue.send(message_id, body, {k: str(v) for k, v in properties.items()})  # the model keeps no fields

    def complete(self, parked: Parked) -> None:
        with self._queue._cv:
            self._queue.dead.remove(parked.lock)


def _peeked(messages: list[QueuedMessage], start: int, count: int, dead_lettered: bool = False) -> list[Peeked]:
    found = sorted((m for m in messages if m.seq >= start), key=lambda m: m.seq)[:count]
    return [Peeked(m.seq, m.enqueued_at, dead_lettered) for m in found]
