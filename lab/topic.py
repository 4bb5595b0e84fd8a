"""A topic with Service Bus semantics, for the outbox's tests: duplicate detection by
MessageId inside a window at the topic, then one copy per subscription (each a peek-lock
queue, shared/idempotency/testing/broker.py). It is a ``Sender``; faults make a send fail before the service
took it (``fail_before``) or after (``lose_ack``: taken, but the sender hears an error)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.idempotency import Outgoing
from shared.idempotency.testing.broker import PeekLockQueue


class SendFailed(Exception):
    pass


@dataclass
class Topic:
    name: str
    subscriptions: dict[str, PeekLockQueue]
    duplicate_window: int = 100_000  # MessageIds remembered (Service Bus: a time window)
    fail_before: int = 0  # the next n sends fail before reaching the topic
    lose_ack: int = 0  # the next n sends reach it, and their answer is lost
    sent: int = 0  # messages the topic took (copied to every subscription)
    dropped_by_detection: int = 0
    attempts: int = 0
    _seen: dict[str, None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, messages: Sequence[Outgoing]) -> None:
        with self._lock:
            self.attempts += 1
            if self.fail_before:
                self.fail_before -= 1
                raise SendFailed("the send did not reach the topic")
            for message in messages:
                if message.destination != self.name:
                    raise SendFailed(f"no entity named {message.destination!r}")
                if message.message_id in self._seen:
                    self.dropped_by_detection += 1
                    continue
                self._seen[message.message_id] = None
                if len(self._seen) > self.duplicate_window:
                    self._seen.pop(next(iter(self._seen)))
                self.sent += 1
                body = json.dumps(message.body).encode()
                for queue in self.subscriptions.values():
                    queue.send(message.message_id, body)
            if self.lose_ack:
                self.lose_ack -= 1
                raise SendFailed("the topic took it; its answer was lost")
