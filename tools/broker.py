"""A delivery simulator with Service Bus peek-lock semantics. A test tool, not a broker.

What it models: a lock per delivery with a duration; lock expiry makes the message
available to another worker while the first may still be running; delivery count;
abandon → redelivery; ``max_delivery_count`` → dead-letter queue with a reason;
completing with a lost lock fails; and send-side duplicate detection over a bounded
history of MessageIds (Service Bus uses a time window), which drops producer retries
that fall inside it and lets later ones through.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class QueuedMessage:
    seq: int
    message_id: str | None
    body: bytes
    delivery_count: int = 0
    token: int = 0  # the current lock's token; 0 when not locked
    locked_until: float = 0.0
    dead_reason: str | None = None


@dataclass(frozen=True)
class Lock:
    message: QueuedMessage
    token: int
    delivery_count: int


class PeekLockQueue:
    def __init__(self, lock_duration: float, max_delivery_count: int, duplicate_window: int) -> None:
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self.duplicate_window = duplicate_window
        self._cv = threading.Condition()
        self._ready: deque[QueuedMessage] = deque()
        self._locked: dict[int, QueuedMessage] = {}
        self._history: OrderedDict[str, None] = OrderedDict()
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self.dead: list[QueuedMessage] = []
        self.sent = self.dropped_by_detection = self.deliveries = self.completed = 0
        self.lock_expiries = self.locks_lost = 0

    # -- producer side ---------------------------------------------------------------

    def send(self, message_id: str | None, body: bytes) -> bool:
        """False when duplicate detection dropped the send (as Service Bus does)."""
        with self._cv:
            self.sent += 1
            if message_id is not None and self.duplicate_window > 0:
                if message_id in self._history:
                    self.dropped_by_detection += 1
                    return False
                self._history[message_id] = None
                if len(self._history) > self.duplicate_window:
                    self._history.popitem(last=False)
            self._ready.append(QueuedMessage(next(self._seq), message_id, body))
            self._cv.notify()
            return True

    def resubmit_dead_letters(self) -> int:
        """What an operator does after an incident: send every dead-lettered message
        again, long after the detection window (so detection does not drop them)."""
        with self._cv:
            dead, self.dead = self.dead, []
            for message in dead:
                self._ready.append(QueuedMessage(next(self._seq), message.message_id, message.body))
            self._cv.notify_all()
            return len(dead)

    # -- consumer side ---------------------------------------------------------------

    def receive(self, timeout: float) -> Lock | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                now = time.monotonic()
                self._expire_locks(now)
                if self._ready:
                    message = self._ready.popleft()
                    message.delivery_count += 1
                    message.token = next(self._tokens)
                    message.locked_until = now + self.lock_duration
                    self._locked[message.seq] = message
                    self.deliveries += 1
                    return Lock(message, message.token, message.delivery_count)
                if not self._locked or now >= deadline:
                    return None
                next_expiry = min(m.locked_until for m in self._locked.values())
                self._cv.wait(max(0.001, min(deadline, next_expiry) - now))

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

    def abandon(self, lock: Lock, why: str = "") -> None:
        with self._cv:
            if lock.message.token == lock.token:
                self._unlock(lock.message, f"abandoned: {why}" if why else "abandoned")

    def drained(self) -> bool:
        with self._cv:
            self._expire_locks(time.monotonic())
            return not self._ready and not self._locked

    def _expire_locks(self, now: float) -> None:
        for message in [m for m in self._locked.values() if m.locked_until <= now]:
            self.lock_expiries += 1
            self._unlock(message, "lock expired")

    def _unlock(self, message: QueuedMessage, why: str) -> None:
        del self._locked[message.seq]
        message.token = 0
        if message.delivery_count >= self.max_delivery_count:
            message.dead_reason = f"MaxDeliveryCountExceeded (last: {why})"
            self.dead.append(message)
        else:
            self._ready.append(message)
        self._cv.notify_all()
