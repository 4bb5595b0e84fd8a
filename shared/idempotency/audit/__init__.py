"""Loss detected from durable facts: every message a Service Bus entity accepted in a window is
accounted for by what its consumer recorded anyway, or reported as unaccounted.

Service Bus gives each accepted message a sequence number, gap-free and increasing per entity
(per partition of a partitioned one). What a consumer leaves for each delivery keeps it
(``Delivery.sequence``, ``enqueued_at``): the marker of a processed message (in the commit's
own write: no extra request), the record of a refused one (its dead letter), a duplicate's own
small record (``facts.record_duplicate``: one insert, only for duplicates), a canary's marker,
and the record a resubmission (resend.py) keeps of a dead-lettered message it sent again.
What the consumer never saw is found where the broker still holds it, by peeking by sequence
number: active (locked or not), scheduled, deferred, or in the dead-letter queue. A number in
the window found nowhere is **unaccounted**: lost between the broker and the consumer (a message
settled without the function being invoked, a resend dropped as a duplicate of another's id).

The window is a range of sequence numbers: after the last one a previous audit closed, up to the
highest one found enqueued before ``until``. A loss at the very end of a window is found once a
later message is seen: a canary (a message with the application property ``dedup-canary``,
``facts.is_canary``), recorded without running the handler, closes an entity's window. One
sequence is audited per entity: a partitioned entity numbers each partition on its own (its
high bits), which this does not split yet.

    received = processed + duplicates + refused + dead-lettered + in flight + unaccounted

Each number is counted once, in the first of those classes that holds it (a message processed
and later resent to the dead-letter queue by hand is processed). The identity closes when
unaccounted is 0.

    python -m shared.idempotency.audit --consumer orders --queue orders [--save]
    python -m shared.idempotency.audit --consumer billing --topic order-events --subscription billing

The window starts after the consumer's checkpoint (the last audit saved with ``--save``; the
first audit starts at the lowest number the consumer recorded in the last 7 days) and ends
``--settle`` (PT15M) ago. One line per unaccounted number, then the account as JSON; each
unaccounted number is also recorded (a dead-letter record, reason ``unaccounted``), logged as an
ERROR and counted in the ``dedup.audit`` metric with the rest of the identity. Exit 1 when some
are unaccounted, 2 when it cannot run (settings, store, broker, unknown consumer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import metrics

from .. import telemetry
from ..errors import ConfigurationError
from ..facts import CANARIES, DUPLICATES, RESENT
from ..keys import consumer_partition
from ..messages import Entity, in_utc, utcnow
from ..reasons import Reason
from ..stores._base import DedupStore
from ..stores._records import DeadLetter

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusReceiver

log = logging.getLogger("idempotency")
_accounted = metrics.get_meter("idempotency").create_counter(
    "dedup.audit", description="Sequence numbers an audit accounted for, by where it found them (unaccounted: lost)"
)
SETTLE = timedelta(minutes=15)  # how long ago a window ends: what is still being delivered is not judged yet
FIRST_WINDOW = timedelta(days=7)  # what the first audit reads back: within the shortest retention (dead letters')


class Found(StrEnum):
    """Where a sequence number was accounted for; the first that holds it counts."""

    PROCESSED = "processed"
    DUPLICATE = "duplicates"
    REFUSED = "refused"
    DEAD_LETTERED = "dead_lettered"  # by the broker (MaxDeliveryCountExceeded, ...): its DLQ holds it
    IN_FLIGHT = "in_flight"  # still in the entity: active, locked, scheduled or deferred


_RANK = {how: rank for rank, how in enumerate(Found)}


@dataclass(frozen=True)
class Peeked:
    sequence: int
    enqueued_at: datetime | None
    dead_lettered: bool = False


class Broker(Protocol):
    """The entity the consumer reads, peeked by sequence number (``ServiceBusPeek`` on Azure)."""

    def peek(self, from_sequence: int, count: int) -> Sequence[Peeked]:
        """Up to ``count`` messages still in the entity from ``from_sequence`` on, in order."""
        ...

    def peek_dead_letters(self, from_sequence: int, count: int) -> Sequence[Peeked]:
        """The same in its dead-letter queue (a dead-lettered message keeps its number)."""
        ...


@dataclass
class Account:
    """One consumer's window: sequence numbers ``first`` to ``last``, each counted once."""

    consumer: str
    first: int
    last: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(Found, 0))
    canaries: int = 0  # among processed: the canary's own messages
    unaccounted: list[tuple[int, datetime | None]] = field(default_factory=list)

    @property
    def received(self) -> int:
        return max(0, self.last - self.first + 1)

    @property
    def closes(self) -> bool:
        return not self.unaccounted and sum(self.counts.values()) == self.received

    def line(self) -> str:
        """The identity in one line (the audit timer's log)."""
        c = self.counts
        return (f"{self.consumer} {self.first}..{self.last}: received {self.received} = processed {c[Found.PROCESSED]} "
                f"(canaries {self.canaries}) + duplicates {c[Found.DUPLICATE]} + refused {c[Found.REFUSED]} + "
                f"dead-lettered {c[Found.DEAD_LETTERED]} + in flight {c[Found.IN_FLIGHT]} + unaccounted "
                f"{len(self.unaccounted)}")  # fmt: skip

    def summary(self) -> dict[str, object]:
        return {"consumer": self.consumer, "first": self.first, "last": self.last, "received": self.received,
                **{str(how): n for how, n in self.counts.items()}, "canaries": self.canaries,
                "unaccounted": len(self.unaccounted), "closes": self.closes,
                "lost": [seq for seq, _ in self.unaccounted][:100]}  # fmt: skip


def account(store: DedupStore, consumer: str, broker: Broker, *, after: int, since: datetime, until: datetime,
            page: int = 250) -> Account:  # fmt: skip
    """Account for every sequence number after ``after`` up to the highest one found enqueued
    before ``until``; the store's facts are those of messages enqueued from ``since`` on (the
    previous window's ``until``; a little earlier is harmless)."""
    where: dict[int, tuple[Found, datetime | None]] = {}
    canaries: set[int] = set()

    def found(sequence: int | None, how: Found, enqueued: datetime | None) -> None:
        if sequence is None or sequence <= after:
            return
        if sequence not in where or _RANK[how] < _RANK[where[sequence][0]]:
            where[sequence] = (how, enqueued)

    # The queue first, its DLQ next, the store last: a message moves only that way (it is settled
    # after the consumer recorded it), so one that moves while the audit reads is seen somewhere.
    for peeked in _all(broker.peek, after + 1, page):
        found(peeked.sequence, Found.IN_FLIGHT, peeked.enqueued_at)
    for peeked in _all(broker.peek_dead_letters, after + 1, page):
        found(peeked.sequence, Found.DEAD_LETTERED, peeked.enqueued_at)
    # every fact from ``since`` on: an enqueued time can be later than a higher number's (a
    # scheduled message, a node that changed owner), so ``until`` only chooses the last number
    for marker in store.sequenced(consumer, since, utcnow() + timedelta(days=1)):
        suffix = marker.key.scope[len(consumer) + 1 :]
        how = {DUPLICATES: Found.DUPLICATE, RESENT: Found.DEAD_LETTERED}.get(suffix, Found.PROCESSED)
        found(marker.sequence, how, marker.enqueued_at)
        if suffix == CANARIES and marker.sequence is not None:
            canaries.add(marker.sequence)
    for letter in store.dead_letters(consumer):
        if letter.reason != Reason.UNACCOUNTED and letter.enqueued_at is not None and since <= letter.enqueued_at:
            found(letter.sequence, Found.REFUSED, letter.enqueued_at)
    closed = [seq for seq, (_, enqueued) in where.items() if enqueued is None or enqueued < until]
    result = Account(consumer, after + 1, max(closed, default=after))
    for sequence in range(result.first, result.last + 1):
        if sequence in where:
            result.counts[where[sequence][0]] += 1
        else:
            result.unaccounted.append((sequence, _near(where, sequence)))
    result.canaries = sum(1 for seq in canaries if seq <= result.last and where[seq][0] is Found.PROCESSED)
    return result


def _all(peek: _Peek, start: int, page: int) -> Iterable[Peeked]:
    while batch := peek(start, page):
        yield from batch
        start = batch[-1].sequence + 1


class _Peek(Protocol):
    def __call__(self, from_sequence: int, count: int) -> Sequence[Peeked]: ...


def _near(where: dict[int, tuple[Found, datetime | None]], sequence: int) -> datetime | None:
    """A lost message's enqueued time is not kept anywhere: the nearest earlier one's bounds it."""
    earlier = [where[s][1] for s in range(sequence - 1, max(0, sequence - 50), -1) if s in where]
    return next((when for when in earlier if when is not None), None)


# -- on Azure: the queue or subscription peeked, the checkpoint, the report --------------------


class ServiceBusPeek:
    """``Broker`` on Azure: a queue or a subscription and its dead-letter queue, peeked (the
    identity needs only to receive on the entity: Azure Service Bus Data Receiver)."""

    def __init__(self, client: ServiceBusClient, queue: str | None = None, topic: str | None = None,
                 subscription: str | None = None) -> None:  # fmt: skip
        if (queue is None) == (topic is None or subscription is None):
            raise ConfigurationError("name a queue, or a topic and its subscription")
        self._client, self._queue, self._topic, self._subscription = client, queue, topic, subscription

    def peek(self, from_sequence: int, count: int) -> list[Peeked]:
        return self._peek(False, from_sequence, count)

    def peek_dead_letters(self, from_sequence: int, count: int) -> list[Peeked]:
        return self._peek(True, from_sequence, count)

    def _peek(self, dead: bool, start: int, count: int) -> list[Peeked]:
        with self._receiver(dead) as receiver:
            found = receiver.peek_messages(max_message_count=count, sequence_number=start)
        return [Peeked(m.sequence_number or 0, in_utc(m.enqueued_time_utc), dead) for m in found]

    def _receiver(self, dead: bool) -> ServiceBusReceiver:
        from azure.servicebus import ServiceBusSubQueue

        sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead else None
        if self._queue is not None:
            return self._client.get_queue_receiver(self._queue, sub_queue=sub_queue)
        assert self._topic is not None and self._subscription is not None
        return self._client.get_subscription_receiver(self._topic, self._subscription, sub_queue=sub_queue)


def checkpoint(store: DedupStore, consumer: str) -> tuple[int, datetime] | None:
    """The last saved window's end: its last sequence number and its ``until``."""
    found = store.read_entities(_checkpoint_place(consumer), "checkpoint", 1)
    if not found:
        return None
    data: dict[str, Any] = found[0].data
    return int(data["last"]), datetime.fromisoformat(data["until"])


def save(store: DedupStore, found: Account, until: datetime) -> None:
    store.put_entity(
        _checkpoint_place(found.consumer), Entity("checkpoint", {"last": str(found.last), "until": until.isoformat()})
    )


def _checkpoint_place(consumer: str) -> str:
    return consumer_partition(f"{consumer}|audit", "checkpoint")


def report(store: DedupStore, found: Account) -> None:
    """Each unaccounted number recorded (a dead letter without a body: what is known of it), the
    account counted in ``dedup.audit``, and an ERROR log when some are unaccounted."""
    for sequence, near in found.unaccounted:
        store.dead_letter(DeadLetter(found.consumer, Reason.UNACCOUNTED, f"sequence number {sequence}: neither the "
                                     "consumer nor the broker holds it (enqueued at or after the time kept)", b"",
                                     sequence=sequence, enqueued_at=near))  # fmt: skip
    for how, n in [*found.counts.items(), (Reason.UNACCOUNTED.value, len(found.unaccounted))]:
        if n:
            _accounted.add(n, {"consumer": found.consumer, "found": how})
    if found.unaccounted:
        log.error("dedup audit: %d message(s) of %s unaccounted: sequence numbers %s", len(found.unaccounted),
                  found.consumer, [seq for seq, _ in found.unaccounted][:20],
                  extra=telemetry.extra({"consumer": found.consumer, "outcome": "unaccounted"}))  # fmt: skip


def run(store: DedupStore, consumer: str, broker: Broker, *, settle: timedelta = SETTLE, keep: bool) -> Account:
    """The window after the consumer's checkpoint (or its first, FIRST_WINDOW back), up to
    ``settle`` ago, accounted for and reported; ``keep``: its end saved as the next checkpoint."""
    until = utcnow() - settle
    saved = checkpoint(store, consumer)
    first_since = until - FIRST_WINDOW
    after, since = saved or (_first_recorded(store, consumer, first_since), first_since)
    found = account(store, consumer, broker, after=after, since=since, until=until)
    report(store, found)
    if keep:
        save(store, found, until)
    return found


def audited(setting: str) -> list[tuple[str, tuple[str | None, str | None, str | None]]]:
    """DEDUP_AUDIT read: ``consumer=queue`` or ``consumer=topic/subscription``, comma-separated;
    each pair as (consumer, (queue, topic, subscription)), what ``ServiceBusPeek`` takes."""
    pairs: list[tuple[str, tuple[str | None, str | None, str | None]]] = []
    for item in filter(None, (part.strip() for part in setting.split(","))):
        consumer, _, entity = (part.strip() for part in item.partition("="))
        topic, slash, subscription = entity.partition("/")
        if not consumer or not entity or (slash and not (topic and subscription)) or "/" in subscription:
            raise ConfigurationError(f"DEDUP_AUDIT: {item!r} is not consumer=queue or consumer=topic/subscription")
        pairs.append((consumer, (None, topic, subscription) if slash else (entity, None, None)))
    return pairs


def _first_recorded(store: DedupStore, consumer: str, since: datetime) -> int:
    """Where the first audit starts: before the lowest number the consumer recorded since then.
    Nothing before it is the audit's to judge (an older message still in the DLQ is not a gap)."""
    numbers = [m.sequence for m in store.sequenced(consumer, since, utcnow() + timedelta(days=1))]
    numbers += [
        d.sequence for d in store.dead_letters(consumer) if d.enqueued_at is not None and d.enqueued_at >= since
    ]
    return min((n for n in numbers if n is not None), default=1) - 1
