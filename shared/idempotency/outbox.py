"""The outbox: what a handler sends is committed with its marker and effects, in the same
transaction (rows beside the data, in the message's partition), then sent, then deleted.

- **Identity**: each message's id derives from (consumer, message key, its name): every
  re-send carries the same MessageId, which Service Bus duplicate detection drops inside the
  destination's window and the next consumer's dedup catches after it.
- **Dispatch after commit, again on every duplicate until done**: a delivery sends what it
  committed; a redelivery that meets the marker reads the key's rows left (one range read)
  and sends them. A failed send gives the message back to the broker, whose redelivery
  sends again; a crash between commit and send, a lost send acknowledgement or a lost
  completion never loses nor doubles a downstream effect.
- **The sweep**, for messages nobody will redeliver (an HTTP call, a broker's last delivery):
  before their commit such a delivery *parks* its key in an index partitioned by the hour it
  falls due; ``sweep`` reads only the hours since its cursor, sends what is still there and
  deletes the index rows. Its cost follows what was parked, never the table's size.

``Dispatch`` is a consumer's side of it, for one batch of deliveries; ``Outbox`` the store's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol

from opentelemetry import metrics

from . import telemetry
from .errors import DedupError, DownstreamUnavailable, InvalidMessage
from .keys import DedupKey
from .messages import Delivery, Entity, Outcome, Outgoing, Result, utcnow
from .reasons import Reason
from .stores._base import DedupStore
from .stores._records import Commit

log = logging.getLogger("idempotency")
_swept = metrics.get_meter("idempotency").create_counter(
    "dedup.outbox.swept", description="Parked keys the outbox sweep handled, by result (sent, failed)"
)

ROWS = "~outbox|"  # the outgoing messages' entity names, beside the business data
DUE = "~outbox-due|"  # the sweep's index: one partition per hour, and its cursor
CURSOR = Entity("cursor", {})
PAGE = 1000  # index rows per read
SWEEPERS = 8  # parked keys the sweep handles at once
BODY_PART = 16_000  # characters of an outgoing body's JSON per stored property
MAX_MESSAGES = 25  # per incoming message: they commit in its transaction (100 operations)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # stored as is in a RowKey: a range read finds it
_HOUR = "%Y%m%d%H"
_DUE = "%Y%m%d%H%M%S"


class Sender(Protocol):
    """Sends outgoing messages, each with its ``message_id`` set. Any exception means "not
    (surely) sent": the same messages are sent again later, with the same ids. It is called
    from several threads at once (concurrent invocations, the sweep). A sender may
    also have ``check(messages)``, called before the commit: it raises InvalidMessage for a
    message it could never send (too large, a session id or property the service refuses),
    so that the incoming message is refused at its first delivery instead of retried."""

    def send(self, messages: Sequence[Outgoing]) -> None: ...


@dataclass(frozen=True)
class Sweep:
    parked: int  # parked keys that were due (a key parked twice has two index rows)
    sent: int  # messages sent
    failed: int  # parked keys whose send failed: tried again next time
    reads: int  # range reads (the cursor and one per page of each hour since it)
    left: bool = False  # stopped by its budget or deadline with due keys left: a backlog


class Parked(NamedTuple):
    """A parked key's index row: its hour's partition and its name."""

    partition: str
    name: str


_TRACED = frozenset({"traceparent", "Diagnostic-Id"})  # a trace context a handler set (read as the triggers read it)


def rows_prefix(key: DedupKey) -> str:
    digest = hashlib.sha256("\x00".join((key.scope, key.id, key.step)).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{ROWS}{digest[:32]}|"


def message_id(key: DedupKey, name: str) -> str:
    """Deterministic: (consumer, message key, the outgoing message's name)."""
    return key.for_step(f"outbox/{name}").downstream_key


def rows(key: DedupKey, messages: Sequence[Outgoing], traceparent: str | None = None) -> list[Entity]:
    """The outgoing messages as entities to commit with the marker; InvalidMessage when
    the handler's messages cannot be stored or told apart. ``traceparent``: the incoming
    message's span, the ``traceparent`` and ``Diagnostic-Id`` application properties of each
    message that has no trace context of its own, so that the trace goes on through the
    send — now or from the sweep."""
    if len(messages) > MAX_MESSAGES:
        raise InvalidMessage(Reason.TOO_MANY_MESSAGES, f"{len(messages)} outgoing messages; at most {MAX_MESSAGES}")
    names = [m.name or str(i) for i, m in enumerate(messages)]
    if len(set(names)) < len(names) or not all(_NAME.fullmatch(n) for n in names):
        raise InvalidMessage(Reason.OUTGOING_NAMES, "outgoing messages need distinct names of 1-64 letters, digits, "
                             "'_', '.' or '-'")  # fmt: skip
    prefix = rows_prefix(key)
    found = []
    for name, message in zip(names, messages, strict=True):
        if not message.destination:
            raise InvalidMessage(Reason.OUTGOING_DESTINATION, f"outgoing message {name!r} has no destination")
        body, properties = _json(message.body, name), dict(message.properties)
        if traceparent and not _TRACED & properties.keys():  # both: the SDK's tracing would set its own Diagnostic-Id
            properties.update(dict.fromkeys(_TRACED, traceparent))
        data = {"destination": message.destination, "messageId": message_id(key, name),
                **_parts(body), "properties": _json(properties, name)}  # fmt: skip
        if message.session_id is not None:
            data["sessionId"] = message.session_id
        found.append(Entity(prefix + name, data))
    return found


def _json(value: object, name: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(Reason.OUTGOING_NOT_JSON, f"outgoing message {name!r}: {exc}"[:500]) from exc


def _parts(body: str) -> dict[str, str]:
    """The body's JSON in properties of at most BODY_PART characters (``body``, ``body1``, …):
    a Table property holds 64 KiB of UTF-16, and a character takes up to 4 bytes of it."""
    parts = [body[i : i + BODY_PART] for i in range(0, len(body), BODY_PART)] or [""]
    return {f"body{i or ''}": part for i, part in enumerate(parts)}


def outgoing(row: Entity) -> Outgoing:
    data = row.data
    parts = [str(data["body"])]
    while f"body{len(parts)}" in data:
        parts.append(str(data[f"body{len(parts)}"]))
    return Outgoing(str(data["destination"]), json.loads("".join(parts)), row.name.rpartition("|")[2],
                    json.loads(str(data.get("properties") or "{}")), data.get("sessionId") or None,
                    str(data["messageId"]))  # fmt: skip


class Outbox:
    """Dispatch and sweep over one store and one sender. ``sweep_delay``: how long after a
    parked delivery's commit the sweep may send for it (longer than an invocation can run,
    so that the sweep never races the invocation's own send)."""

    def __init__(self, store: DedupStore, sender: Sender, *, sweep_delay: timedelta = timedelta(minutes=10)) -> None:
        self.store = store
        self.sender = sender
        self.sweep_delay = sweep_delay

    def park(self, partition: str, key: DedupKey, now: datetime | None = None, *,
             again: Parked | None = None) -> Parked:  # fmt: skip
        """Index the key for the sweep, before its commit; ``unpark`` once the delivery sent
        its messages itself, so that the sweep only meets what is really left. ``again``: the
        row this delivery parked before, written again under its name (a sweep may have taken
        it) when a new row would fall in the same hour: the sweep's cursor is then as far from
        it as from a new one, and the key keeps one row."""
        due = (now or utcnow()) + self.sweep_delay
        hour = DUE + f"{due:{_HOUR}}"
        parked = again if again and again.partition == hour else Parked(hour, f"{due:{_DUE}}|{rows_prefix(key)}")
        self.store.put_entity(parked.partition, Entity(parked.name, {"partition": partition}))
        return parked

    def unpark(self, parked: Parked) -> None:
        """Best effort: an index row left behind costs the sweep one read, nothing more."""
        try:
            self.store.delete_entities(parked.partition, [parked.name])
        except DedupError as exc:
            log.debug("outbox: index row %s left for the sweep: %s", parked.name, exc)

    def dispatch(self, partition: str, key_rows: str, committed: Sequence[Entity] | None = None,
                 sender: Sender | None = None) -> int:  # fmt: skip
        """Send the rows under ``key_rows`` (the ones just ``committed``, or else those the
        store still holds), then delete them. DownstreamUnavailable when the send failed:
        nothing is deleted, and the next try sends the same messages again."""
        found = self.store.read_entities(partition, key_rows, MAX_MESSAGES) if committed is None else list(committed)
        if not found:
            return 0
        try:
            (sender or self.sender).send([outgoing(row) for row in found])
        except Exception as exc:  # whatever failed, the rows stay to be sent again
            raise DownstreamUnavailable(f"outgoing messages not sent: {exc!r}"[:500]) from exc
        self.store.delete_entities(partition, [row.name for row in found])
        return len(found)

    def _later(self, index: Entity, hour: str, now: datetime) -> bool:
        """Move a key whose send failed to the hour it is due again, so that one destination
        that stays down holds neither the cursor nor the reads; False if it could not move."""
        due = now + max(self.sweep_delay, timedelta(seconds=1))  # never due again in this sweep
        moved = Entity(f"{due:{_DUE}}|{index.name.partition('|')[2]}", index.data)
        try:
            self.store.put_entity(DUE + f"{due:{_HOUR}}", moved)
            self.store.delete_entities(hour, [index.name])
        except DedupError:
            return False
        return True

    def sweep(self, now: datetime, *, since: timedelta, budget: int = 100_000, deadline: float = math.inf,
              senders: Mapping[str, Sender] | None = None) -> Sweep:  # fmt: skip
        """Send what parked deliveries left, hour by hour from the cursor (first run: ``since``
        ago) to ``now``, at most ``budget`` keys and until ``deadline`` (``time.monotonic()``);
        the cursor moves past every hour left empty. ``senders``: each consumer's own sender,
        by name (a parked key's partition names its consumer); by default this outbox's.
        A store that fails mid-way stops the sweep where it is: nothing is lost, the next
        sweep reads from its cursor again."""
        tally = Sweep(0, 0, 0, 1)
        try:
            stored = self.store.read_entities(DUE + "cursor", "cursor", 1)
            first = (now - since).replace(minute=0, second=0, microsecond=0)
            start = _hour(str(stored[0].data["hour"])) if stored else first
            hour, cursor, moving = start, start, True
            while hour <= now and not tally.left:
                partition, left = DUE + f"{hour:{_HOUR}}", False
                while not left:
                    if time.monotonic() >= deadline:
                        tally = replace(tally, left=True)
                        break
                    room = budget - tally.parked
                    limit = min(PAGE, room + 1)  # one row past the budget tells whether one is left
                    indexes = self.store.read_entities(partition, "", limit)
                    due = [index for index in indexes if _at(index.name[:14]) <= now]
                    page = self._sweep_page(partition, due[:room], now, senders)
                    tally = Sweep(tally.parked + page.parked, tally.sent + page.sent, tally.failed + page.failed,
                                  tally.reads + 1 + page.reads, len(due) > room)  # fmt: skip
                    left = len(due) < len(indexes) or page.left or tally.left  # rows not due, stuck, or budget
                    if len(indexes) < limit:
                        break
                moving = moving and not left and hour + timedelta(hours=1) <= now
                if moving:
                    cursor = hour + timedelta(hours=1)
                hour += timedelta(hours=1)
            if cursor != start or not stored:
                self.store.put_entity(DUE + "cursor", replace(CURSOR, data={"hour": f"{cursor:{_HOUR}}"}))
        except DedupError as exc:  # the store failed: stop here; what was done is done
            log.error("outbox sweep stopped: %s", exc)
            tally = replace(tally, left=True)
        _swept.add(tally.parked - tally.failed, {"result": "sent"})
        _swept.add(tally.failed, {"result": "failed"})  # a backlog: the alert "outbox backlog" watches it
        return tally

    def _sweep_page(self, partition: str, due: Sequence[Entity], now: datetime,
                    senders: Mapping[str, Sender] | None) -> Sweep:  # fmt: skip
        """One page of due index rows: each key's rows read once (a key parked twice has two
        index rows), SWEEPERS at a time; each consumer's messages sent together (its sender
        batches them per destination: a page costs a few sends, not one per key); the rows of
        what was sent deleted, then their index rows together. ``left``: an index row could not
        be moved (it must not be read again)."""
        if not due:
            return Sweep(0, 0, 0, 0)
        keys = list(dict.fromkeys(_parked_key(index) for index in due))
        with ThreadPoolExecutor(SWEEPERS) as pool:
            found = dict(zip(keys, pool.map(lambda key: self.store.read_entities(key[0], key[1], MAX_MESSAGES), keys),
                             strict=True))  # fmt: skip
        by_consumer: dict[str, list[tuple[str, str]]] = {}
        for key in keys:
            by_consumer.setdefault(key[0].partition("|")[0], []).append(key)  # a partition names its consumer
        sent: set[tuple[str, str]] = set()
        for consumer, mine in by_consumer.items():
            sender = self.sender if senders is None else senders.get(consumer)
            messages = [outgoing(row) for key in mine for row in found[key]]
            try:
                if messages:
                    if sender is None:
                        raise LookupError(f"no consumer named {consumer!r} sends in this app")
                    sender.send(messages)
            except Exception as exc:  # noqa: BLE001 - whatever failed, the rows stay to be sent again
                log.error("outbox sweep: %d parked keys of %s not sent: %r", len(mine), consumer, exc)
                continue
            sent.update(mine)
        with ThreadPoolExecutor(SWEEPERS) as pool:
            list(pool.map(lambda key: self.store.delete_entities(key[0], [row.name for row in found[key]]),
                          [key for key in keys if key in sent and found[key]]))  # fmt: skip
        done = [index for index in due if _parked_key(index) in sent]
        if done:
            self.store.delete_entities(partition, [index.name for index in done])
        stuck = [index for index in due if _parked_key(index) not in sent and not self._later(index, partition, now)]
        return Sweep(len(keys), sum(len(found[key]) for key in sent), len(keys) - len(sent), 0, bool(stuck))


class Dispatch:
    """A consumer's outbox over one batch of deliveries. Before the commit: the handler's
    messages as rows to commit with the marker, checked by the sender, and the key parked
    for the sweep when nobody will deliver the message again if it is not acknowledged (an
    HTTP call, a broker's last delivery). After it: what the commit holds sent, its index row
    taken back, ``on_sent`` told. A failed send waits as any transient failure; a delivery
    nobody redelivers is acknowledged instead, parked: its messages are committed, the
    sweep sends them."""

    def __init__(self, outbox: Outbox, max_deliveries: int, on_sent: Callable[[DedupKey, str], None]) -> None:
        self.outbox = outbox
        self._max_deliveries = max_deliveries
        self._on_sent = on_sent
        self._parked: dict[DedupKey, Parked] = {}  # keys indexed for the sweep, once per delivery

    def rows(self, delivery: Delivery, key: DedupKey, partition: str, messages: Sequence[Outgoing]) -> list[Entity]:
        found = rows(key, messages, telemetry.traceparent())  # its message's span is current
        check = getattr(self.outbox.sender, "check", None)  # what the sender can never send: refused now
        if check is not None:
            check([outgoing(row) for row in found])
        if self._nobody_redelivers(delivery) and key not in self._parked:
            self._parked[key] = self.outbox.park(partition, key)
        return found

    def send(self, delivery: Delivery, commit: Commit, result: Result, *, retry: bool) -> Result:
        """Send what the commit holds: the rows just committed, or (a duplicate, a retry)
        those the store still has."""
        prefix = rows_prefix(commit.key)
        fresh = result.outcome is Outcome.PROCESSED and not retry
        try:
            self.outbox.dispatch(commit.partition, prefix, [e for e in commit.effects if e.name.startswith(prefix)]
                                 if fresh else None)  # fmt: skip
        except DedupError as exc:
            # Parked again: the row written before the commit may be gone already (a sweep that
            # met it before the commit found nothing to send, and took it).
            if self._nobody_redelivers(delivery) and self.leave(commit.key, commit.partition):
                # An HTTP call's send waits for the sweep quietly; a broker's last delivery alerts
                # (a destination missing or a role not granted fails every send until fixed).
                log.log(logging.WARNING if delivery.delivery_count is None else logging.ERROR,
                        "dedup outbox: %s left for the sweep: %s", commit.key, exc)  # fmt: skip
                if result.declined:  # its reason and detail are the decline's, answered and replayed
                    return result
                return replace(result, reason=Reason.OUTBOX_PARKED, detail=str(exc)[:500])
            return Result(Outcome.TRANSIENT, commit.key, Reason.DISPATCH_FAILED, str(exc)[:500],
                          fingerprint=commit.fingerprint)  # fmt: skip
        if commit.key in self._parked:
            self.outbox.unpark(self._parked.pop(commit.key))
        self._on_sent(commit.key, commit.fingerprint)
        return result

    def leave(self, key: DedupKey, partition: str) -> bool:
        """Park the key for the sweep (again: a sweep may have taken its row); False if it
        could not be parked, and then the message must not be acknowledged either."""
        try:
            self._parked[key] = self.outbox.park(partition, key, again=self._parked.get(key))
        except DedupError:
            return False
        return True

    def left(self, key: DedupKey) -> bool:
        return key in self._parked

    def _nobody_redelivers(self, delivery: Delivery) -> bool:
        return delivery.delivery_count is None or delivery.is_last(self._max_deliveries)


def _parked_key(index: Entity) -> tuple[str, str]:
    """An index row's key: its rows' partition and their name prefix."""
    return str(index.data["partition"]), index.name.partition("|")[2]


def _hour(text: str) -> datetime:
    return datetime.strptime(text, _HOUR).replace(tzinfo=UTC)


def _at(text: str) -> datetime:
    return datetime.strptime(text, _DUE).replace(tzinfo=UTC)
