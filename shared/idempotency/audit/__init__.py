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
highest one found enqueued before ``until`` — at most ``MAX_WINDOW`` of them (a larger one is cut
there and the next run goes on, or refused by the command without ``--save``), and only as far back
as the store keeps its facts (markers for DEDUP_RETENTION, dead-letter records for
DEDUP_DEAD_LETTER_RETENTION, less ``settle``): what is older is not judged, and the account says so
(``Account.skipped``) — a purged fact is never a loss. A loss at the very end of a window is found once a
later message is seen: a canary (a message with the application property ``dedup-canary``,
``facts.is_canary``), recorded without running the handler, closes an entity's window. What
the audit cannot tell: a scheduled message its producer cancelled leaves a number that nobody
holds, as a lost one does — it is reported as unaccounted, and named as possibly that. One
sequence is audited per entity: a partitioned entity numbers each partition on its own (its
high bits), which this does not split yet.

    received = processed + duplicates + refused + dead-lettered + in flight + unaccounted

Each number is counted once, in the first of those classes that holds it (a message processed
and later resent to the dead-letter queue by hand is processed). The identity closes when
unaccounted is 0.

    python -m shared.idempotency.audit --consumer orders --queue orders [--save]
    python -m shared.idempotency.audit --consumer billing --topic order-events --subscription billing

The window starts after the consumer's checkpoint (the last audit saved with ``--save``; the
first audit starts at the lowest number enqueued in the last 7 days that the consumer recorded
or the entity still holds, active, scheduled or dead-lettered) and ends ``--settle`` (PT15M) ago.
One line per unaccounted number, with its neighbours' enqueued times, then the account as JSON;
with ``--save`` (what the hourly timer does) each unaccounted number is also recorded (a
dead-letter record, reason ``unaccounted``), logged as an ERROR and counted in the ``dedup.audit``
metric with the rest of the identity — without it the command reads only. Exit 1 when some
are unaccounted, 2 when it cannot run (settings, a table, the broker, an unknown consumer, a
window over ``MAX_WINDOW`` without ``--save``).
"""

from __future__ import annotations

import bisect
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from opentelemetry import metrics

from .. import telemetry
from ..config import retention
from ..errors import ConfigurationError, DedupError
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
# Sequence numbers one run judges at most: its peeks (250 a request), its memory and the records it
# writes stay bounded; a busier hour is audited over the next runs.
MAX_WINDOW = 100_000


class WindowTooLarge(DedupError):
    """The window holds more than ``MAX_WINDOW`` numbers: audit it in parts (``--save``)."""


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


class Gap(NamedTuple):
    """A number nobody holds, between the nearest numbers found around it in the window (each
    (sequence number, enqueued time), None at the window's edge): its own time is kept nowhere."""

    sequence: int
    earlier: tuple[int, datetime | None] | None = None
    later: tuple[int, datetime | None] | None = None

    @property
    def near(self) -> datetime | None:
        """A time the lost message was enqueued at or after (its earlier neighbour's), else before."""
        return next((when for _, when in filter(None, (self.earlier, self.later)) if when is not None), None)

    def between(self) -> str:
        """Its neighbours' enqueued times, as the command prints them."""

        def shown(neighbour: tuple[int, datetime | None]) -> str:
            sequence, when = neighbour
            return f"{when.isoformat() if when else 'an unknown time'} (#{sequence})"

        if self.earlier and self.later:
            return f"enqueued between {shown(self.earlier)} and {shown(self.later)}"
        return f"enqueued after {shown(self.earlier)}" if self.earlier else (
            f"enqueued before {shown(self.later)}" if self.later else "enqueued at an unknown time")  # fmt: skip


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
    unaccounted: list[Gap] = field(default_factory=list)
    # Not judged, said so: numbers whose facts the store may have purged (before ``first``), and
    # what a window over MAX_WINDOW left for the next run (after ``last``); a note each.
    skipped: list[str] = field(default_factory=list)
    cut: bool = False  # over MAX_WINDOW: the numbers after ``last`` are the next window's

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
                "lost": [gap.sequence for gap in self.unaccounted][:100],
                **({"skipped": self.skipped} if self.skipped else {})}  # fmt: skip


def account(store: DedupStore, consumer: str, broker: Broker, *, after: int, since: datetime, until: datetime,
            page: int = 250, cut: bool = True) -> Account:  # fmt: skip
    """Account for every sequence number after ``after`` up to the highest one found enqueued
    before ``until``, at most MAX_WINDOW of them (``cut``: the rest left for the next window, said
    in ``skipped``; else WindowTooLarge); the store's facts are those of messages enqueued from
    ``since`` on (the previous window's ``until``; a little earlier is harmless)."""
    where: dict[int, tuple[Found, datetime | None]] = {}
    canaries: set[int] = set()
    beyond = after + MAX_WINDOW  # what a peek need not read past, nor the account keep
    over: list[int] = []  # the highest number past it enqueued before ``until``, if any

    def found(sequence: int | None, how: Found, enqueued: datetime | None) -> None:
        if sequence is None or sequence <= after:
            return
        if sequence > beyond:  # the next window's: only how far it goes is kept
            if (enqueued is None or enqueued < until) and (not over or sequence > over[0]):
                over[:] = [sequence]
            return
        if sequence not in where or _RANK[how] < _RANK[where[sequence][0]]:
            where[sequence] = (how, enqueued)

    # The queue first, its DLQ next, the store last: a message moves only that way (it is settled
    # after the consumer recorded it), so one that moves while the audit reads is seen somewhere.
    for peeked in _all(broker.peek, after + 1, page, beyond):
        found(peeked.sequence, Found.IN_FLIGHT, peeked.enqueued_at)
    for peeked in _all(broker.peek_dead_letters, after + 1, page, beyond):
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
    last = max([*closed, *over], default=after)
    skipped = []
    if last > beyond:
        if not cut:
            raise WindowTooLarge(f"the window {after + 1}..{last} holds {last - after:,} sequence numbers, over "
                                 f"{MAX_WINDOW:,}: audit it in parts, --save (each run goes on where the last "
                                 "stopped)")  # fmt: skip
        skipped.append(f"{beyond + 1}..{last}: over {MAX_WINDOW:,} numbers, left for the next window")
        last = beyond
    result = Account(consumer, after + 1, last, skipped=skipped, cut=bool(skipped))
    found_at = sorted(seq for seq in where if seq <= last)
    for sequence in range(result.first, result.last + 1):
        if sequence in where:
            result.counts[where[sequence][0]] += 1
        else:
            result.unaccounted.append(_gap(where, found_at, sequence))
    result.canaries = sum(1 for seq in canaries if seq <= result.last and where[seq][0] is Found.PROCESSED)
    return result


def _all(peek: _Peek, start: int, page: int, beyond: int) -> Iterable[Peeked]:
    """Every message ``peek`` holds from ``start`` on, page by page, up to the first past ``beyond``."""
    while batch := peek(start, page):
        yield from batch
        if batch[-1].sequence > beyond:
            return
        start = batch[-1].sequence + 1


class _Peek(Protocol):
    def __call__(self, from_sequence: int, count: int) -> Sequence[Peeked]: ...


def _gap(where: dict[int, tuple[Found, datetime | None]], found_at: list[int], sequence: int) -> Gap:
    """A lost number and its nearest found neighbours, with their real enqueued times."""
    at = bisect.bisect_left(found_at, sequence)
    earlier = found_at[at - 1] if at > 0 else None
    later = found_at[at] if at < len(found_at) else None
    return Gap(sequence, None if earlier is None else (earlier, where[earlier][1]),
               None if later is None else (later, where[later][1]))  # fmt: skip


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


UNACCOUNTED = (
    "neither the consumer nor the broker holds it: lost between them, or a scheduled message its "
    "producer cancelled (the audit cannot tell them apart)"
)


def report(store: DedupStore, found: Account) -> None:
    """Each unaccounted number recorded (a dead letter without a body: what is known of it), the
    account counted in ``dedup.audit``, and an ERROR log when some are unaccounted."""
    for gap in found.unaccounted:
        store.dead_letter(DeadLetter(found.consumer, Reason.UNACCOUNTED, f"sequence number {gap.sequence}: "
                                     f"{UNACCOUNTED}; {gap.between()}", b"", sequence=gap.sequence,
                                     enqueued_at=gap.near))  # fmt: skip
    for how, n in [*found.counts.items(), (Reason.UNACCOUNTED.value, len(found.unaccounted))]:
        if n:
            _accounted.add(n, {"consumer": found.consumer, "found": how})
    if found.unaccounted:
        log.error("dedup audit: %d message(s) of %s unaccounted: sequence numbers %s", len(found.unaccounted),
                  found.consumer, [gap.sequence for gap in found.unaccounted][:20],
                  extra=telemetry.extra({"consumer": found.consumer, "outcome": "unaccounted"}))  # fmt: skip


def run(store: DedupStore, consumer: str, broker: Broker, *, settle: timedelta = SETTLE, keep: bool,
        page: int = 250, kept_for: timedelta | None = None) -> Account:  # fmt: skip
    """The window after the consumer's checkpoint (or its first, FIRST_WINDOW back), up to
    ``settle`` ago, accounted for. ``keep``: reported (recorded, logged, counted) and its end saved
    as the next checkpoint, a window over MAX_WINDOW cut there; else read only, and such a window
    refused (WindowTooLarge). ``kept_for``: how long the consumer keeps its markers (its
    retention; default DEDUP_RETENTION), its dead-letter records the store's: facts read from
    further back may be purged. A checkpoint older than that goes on as a first window does, from
    the lowest number recorded or held since what is kept (never back before the checkpoint): the
    numbers between are not judged, and said so."""
    until = utcnow() - settle
    kept_since = utcnow() - min(kept_for or retention(), store.dead_letter_retention) + settle
    saved = checkpoint(store, consumer)
    first_since = max(until - FIRST_WINDOW, kept_since)
    skipped = []
    if saved is not None and saved[1] < kept_since:  # facts since the checkpoint may be purged
        lowest = _first(store, consumer, broker, kept_since, page)
        if lowest is not None and lowest > saved[0]:
            skipped.append(f"{saved[0] + 1}..{lowest}: enqueued before {kept_since.isoformat(timespec='seconds')}, "
                           "longer ago than the store keeps their facts (markers, dead-letter records): "
                           "not judged")  # fmt: skip
        saved = (max(saved[0], lowest or 0), kept_since)
    after, since = saved or (_first(store, consumer, broker, first_since, page), first_since)
    if after is None:  # nothing recorded nor held yet: nothing to judge, no checkpoint
        return Account(consumer, 1, 0, skipped=skipped)
    found = account(store, consumer, broker, after=after, since=since, until=until, page=page, cut=keep)
    found.skipped[:0] = skipped
    if keep:
        report(store, found)
        save(store, found, since if found.cut else until)  # cut: the rest's facts are read from the same time
    return found


Peekable = tuple[str | None, str | None, str | None]  # (queue, topic, subscription): what ServiceBusPeek takes


def audited(setting: str) -> list[tuple[str, Peekable | None]]:
    """DEDUP_AUDIT read: ``consumer=queue`` or ``consumer=topic/subscription`` (audit it there,
    in place of what its trigger reads) or ``-consumer`` (do not audit it), comma-separated; each
    as (consumer, (queue, topic, subscription)), or (consumer, None) for an exclusion."""
    pairs: list[tuple[str, Peekable | None]] = []
    for item in filter(None, (part.strip() for part in setting.split(","))):
        if item.startswith("-") and "=" not in item and item[1:].strip():
            pairs.append((item[1:].strip(), None))
            continue
        consumer, _, entity = (part.strip() for part in item.partition("="))
        topic, slash, subscription = entity.partition("/")
        if not consumer or not entity or (slash and not (topic and subscription)) or "/" in subscription:
            raise ConfigurationError(f"DEDUP_AUDIT: {item!r} is not consumer=queue, consumer=topic/subscription "
                                     "or -consumer")  # fmt: skip
        pairs.append((consumer, (None, topic, subscription) if slash else (entity, None, None)))
    return pairs


def _first(store: DedupStore, consumer: str, broker: Broker, since: datetime, page: int) -> int | None:
    """Where a first window starts: before the lowest number enqueued since ``since`` that the
    consumer recorded or the entity still holds (active, scheduled, dead-lettered). Nothing older
    is the audit's to judge (an old message still in the DLQ is not a gap); None when nothing is
    found at all: nothing to audit yet (and no checkpoint: the next run looks again)."""
    numbers = [m.sequence for m in store.sequenced(consumer, since, utcnow() + timedelta(days=1))]
    numbers += [
        d.sequence
        for d in store.dead_letters(consumer)
        if d.reason != Reason.UNACCOUNTED and d.enqueued_at is not None and d.enqueued_at >= since
    ]  # an audit's own records are no facts
    for peek in (broker.peek, broker.peek_dead_letters):  # the first held since: among at most MAX_WINDOW
        held = (p.sequence for p in islice(_all(peek, 0, page, sys.maxsize), MAX_WINDOW)
                if p.enqueued_at is None or p.enqueued_at >= since)  # fmt: skip
        numbers.append(next(held, None))
    lowest = min((n for n in numbers if n is not None), default=None)
    return None if lowest is None else lowest - 1
