"""A dead-lettered message sent again (shared.idempotency.resend) carries its original's first
enqueued time (``dedup-enqueued-at``), a copy's copy the first's; what the consumer does with it
(refuses a copy older than its marker is sure to be kept, ``expired``) is
tests/integration/test_decisions.py's."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.idempotency.facts import ENQUEUED_PROPERTY, first_enqueued
from shared.idempotency.resend import Parked, resend
from shared.idempotency.stores import MemoryStore

FIRST = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class DeadLetterQueue:
    """A dead-letter queue holding ``parked``, recording what is sent back and completed."""

    def __init__(self, *parked: Parked) -> None:
        self.parked, self.sent, self.completed = list(parked), list[dict[str, Any]](), list[int]()

    def receive(self, count: int) -> list[Parked]:
        return self.parked[:count]

    def send(self, body: bytes, message_id: str, properties: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        self.sent.append(dict(properties))

    def complete(self, parked: Parked) -> None:
        self.completed.append(parked.sequence)


def test_a_resent_message_carries_its_originals_first_enqueued_time() -> None:
    once = Parked(7, FIRST, "m-1", b"{}", {}, None)
    again = Parked(9, FIRST + timedelta(days=3), "resent-1", b"{}", {"dedup-key": "m-2", ENQUEUED_PROPERTY:
                                                                     FIRST.isoformat()}, None)  # fmt: skip
    queue = DeadLetterQueue(once, again)
    resend(MemoryStore(), "orders", queue, 10)
    assert [first_enqueued(properties) for properties in queue.sent] == [FIRST, FIRST]  # the copy's copy too
    assert [properties["dedup-key"] for properties in queue.sent] == ["m-1", "m-2"] and queue.completed == [7, 9]


def test_an_unreadable_first_enqueued_time_is_no_time() -> None:
    assert first_enqueued({ENQUEUED_PROPERTY: "yesterday"}) is None
    assert first_enqueued({ENQUEUED_PROPERTY: "2026-03-01T12:00:00"}) == FIRST  # naive: UTC, as Service Bus's
