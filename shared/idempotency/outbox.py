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
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import NamedTuple, Protocol

from opentelemetry import metrics

from .errors import DedupError, DownstreamUnavailable, InvalidMessage
from .keys import DedupKey
from .messages import Entity, Outgoing, utcnow
from .stores._base import DedupStore

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
    parked: int  # index rows read that were due
    sent: int  # messages sent
    failed: int  # parked keys whose send failed: tried again next time
    reads: int  # range reads (the cursor and one per page of each hour since it)
    left: bool = False  # stopped by its budget or deadline with due keys left: a backlog


class Parked(NamedTuple):
    """A parked key's index row: its hour's partition and its name."""

    partition: str
    name: str


def rows_prefix(key: DedupKey) -> str:
    digest = hashlib.sha256("\x00".join((key.scope, key.id, key.step)).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{ROWS}{digest[:32]}|"


def message_id(key: DedupKey, name: str) -> str:
    """Deterministic: (consumer, message key, the outgoing message's name)."""
    return key.for_step(f"outbox/{name}").downstream_key


def rows(key: DedupKey, messages: Sequence[Outgoing]) -> list[Entity]:
    """The outgoing messages as entities to commit with the marker; InvalidMessage when
    the handler's messages cannot be stored or told apart."""
    if len(messages) > MAX_MESSAGES:
        raise InvalidMessage("too_many_messages", f"{len(messages)} outgoing messages; at most {MAX_MESSAGES}")
    names = [m.name or str(i) for i, m in enumerate(messages)]
    if len(set(names)) < len(names) or not all(_NAME.fullmatch(n) for n in names):
        raise InvalidMessage("outgoing_names", "outgoing messages need distinct names of 1-64 letters, digits, "
                             "'_', '.' or '-'")  # fmt: skip
    prefix = rows_prefix(key)
    found = []
    for name, message in zip(names, messages, strict=True):
        if not message.destination:
            raise InvalidMessage("outgoing_destination", f"outgoing message {name!r} has no destination")
        body = _json(message.body, name)
        data = {"destination": message.destination, "messageId": message_id(key, name),
                **_parts(body), "properties": _json(dict(message.properties), name)}  # fmt: skip
        if message.session_id is not None:
            data["sessionId"] = message.session_id
        found.append(Entity(prefix + name, data))
    return found


def _json(value: object, name: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("outgoing_not_json", f"outgoing message {name!r}: {exc}"[:500]) from exc


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

    def park(self, partition: str, key: DedupKey, now: datetime | None = None) -> Parked:
        """Index the key for the sweep, before its commit; ``unpark`` once the delivery sent
        its messages itself, so that the sweep only meets what is really left."""
        due = (now or utcnow()) + self.sweep_delay
        parked = Parked(DUE + f"{due:{_HOUR}}", f"{due:{_DUE}}|{rows_prefix(key)}")
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
        by name (a parked key's partition names its consumer); by default this outbox's."""
        stored = self.store.read_entities(DUE + "cursor", "cursor", 1)
        first = (now - since).replace(minute=0, second=0, microsecond=0)
        start = _hour(str(stored[0].data["hour"])) if stored else first
        hour, cursor, reads = start, start, 1
        parked = sent = failed = 0
        moving, stopped = True, False
        while hour <= now and not stopped:
            partition, left = DUE + f"{hour:{_HOUR}}", False
            while not left:
                limit = min(PAGE, budget - parked)
                if limit <= 0 or time.monotonic() >= deadline:
                    stopped = left = True
                    break
                indexes = self.store.read_entities(partition, "", limit)
                reads += 1
                due = [index for index in indexes if _at(index.name[:14]) <= now]
                left = len(due) < len(indexes)  # the rest of the hour is not due yet
                done: list[tuple[int, bool, bool] | None] = []
                if due:
                    one = partial(self._sweep_one, partition=partition, now=now, deadline=deadline, senders=senders)
                    with ThreadPoolExecutor(SWEEPERS) as pool:  # keys are independent: overlap their requests
                        done = list(pool.map(one, due))
                sent_rows = [i.name for i, outcome in zip(due, done, strict=False) if outcome and not outcome[1]]
                if sent_rows:  # their index rows, together (one request per 100 on Table Storage)
                    self.store.delete_entities(partition, sent_rows)
                parked += sum(outcome is not None for outcome in done)
                sent += sum(outcome[0] for outcome in done if outcome is not None)
                failed += sum(outcome[1] for outcome in done if outcome is not None)
                stopped = None in done
                left = left or stopped or any(outcome is not None and outcome[2] for outcome in done)
                if len(indexes) < limit:
                    break
            moving = moving and not left and hour + timedelta(hours=1) <= now
            if moving:
                cursor = hour + timedelta(hours=1)
            hour += timedelta(hours=1)
        if cursor != start or not stored:
            self.store.put_entity(DUE + "cursor", replace(CURSOR, data={"hour": f"{cursor:{_HOUR}}"}))
        _swept.add(parked - failed, {"result": "sent"})
        _swept.add(failed, {"result": "failed"})  # a backlog: the alert "outbox backlog" watches it
        return Sweep(parked, sent, failed, reads, stopped)

    def _sweep_one(self, index: Entity, partition: str, now: datetime, deadline: float,
                   senders: Mapping[str, Sender] | None) -> tuple[int, bool, bool] | None:  # fmt: skip
        """Send one parked key's messages: (messages sent, whether its send failed, whether its
        index row is stuck where it is); None when the deadline passed first. The sweep deletes
        the index rows of the keys sent, a page at a time: a crash before leaves them to the next
        sweep, which finds nothing to send."""
        if time.monotonic() >= deadline:
            return None
        target = str(index.data["partition"])
        consumer = target.partition("|")[0]  # a parked key's partition names its consumer
        try:
            sender = self.sender if senders is None else senders.get(consumer)
            if sender is None:
                raise DownstreamUnavailable(f"no consumer named {consumer!r} sends in this app")
            sent = self.dispatch(target, index.name.partition("|")[2], sender=sender)
        except DedupError as exc:
            log.error("outbox sweep: %s of %s not sent: %s", index.name.partition("|")[2], consumer, exc)
            return 0, True, not self._later(index, partition, now)
        return sent, False, False


def _hour(text: str) -> datetime:
    return datetime.strptime(text, _HOUR).replace(tzinfo=UTC)


def _at(text: str) -> datetime:
    return datetime.strptime(text, _DUE).replace(tzinfo=UTC)
