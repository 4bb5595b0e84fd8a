"""What goes through a consumer: a ``Delivery`` in, a ``Result`` with its ``Outcome`` out;
and what a handler decides: ``Effects`` (``Entity`` records inserted with the marker, each
``Change`` of what it read as ``Stored``, a JSON result, ``Outgoing`` messages, or that it
``Declined`` the message) or a ``LatestState``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from .errors import (
    DownstreamRejected,
    DownstreamUnavailable,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    StoreUnavailable,
)
from .keys import DedupKey
from .reasons import Reason

JSON = Any  # a value that json.dumps accepts
log = logging.getLogger("idempotency")

MAX_RESULT_CHARACTERS = 30_000  # of a stored result as compact JSON: one Table property holds 32 K
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def check_result(value: JSON, what: str) -> None:
    """A result is stored with its marker and replayed: JSON (no NaN, no sets or times),
    at most MAX_RESULT_CHARACTERS once serialised; else InvalidMessage."""
    try:
        size = len(_compact(value))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(Reason.RESULT_NOT_JSON, f"{what} must be JSON: {exc}"[:500]) from exc
    if size > MAX_RESULT_CHARACTERS:
        raise InvalidMessage(Reason.RESULT_TOO_LARGE, f"{what} is {size} characters of JSON; "
                             f"at most {MAX_RESULT_CHARACTERS} are stored")  # fmt: skip


def utcnow() -> datetime:
    return datetime.now(UTC)


def in_utc(when: datetime | None) -> datetime | None:
    """A service's time as an aware one: naive means UTC (as the Functions host passes them)."""
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


@dataclass(frozen=True)
class Entity:
    """A business record written with a marker. ``name`` is unique within the message's
    partition (Table RowKey, Cosmos id suffix); the store places it beside the marker."""

    name: str
    data: dict[str, JSON]


@dataclass(frozen=True)
class Stored:
    """A business entity of the message's partition as the handler read it (``context.read``):
    its data and the version (the store's ETag) a change of it is conditioned on; ``data`` None
    when there is none. A change of what was read commits with the marker only if the entity is
    still as read: else the message is decided again, from a fresh read."""

    name: str
    data: dict[str, JSON] | None
    etag: str | None = None

    @property
    def exists(self) -> bool:
        return self.data is not None

    def replaced(self, data: dict[str, JSON]) -> Change:
        """Its data replaced by ``data`` (created, when there is none: it must still not exist)."""
        return Change(self.name, data, self.etag, merge=False)

    def merged(self, data: dict[str, JSON]) -> Change:
        """``data``'s properties set, the others kept (created with them, when there is none)."""
        return Change(self.name, data, self.etag, merge=True)

    def deleted(self) -> Change:
        if self.data is None:
            raise ValueError(f"{self.name}: there is no stored entity to delete")
        return Change(self.name, None, self.etag)


@dataclass(frozen=True)
class Change:
    """A change of a stored entity, conditioned on the version read (``Stored.replaced``,
    ``merged``, ``deleted``): ``etag`` None creates it (it must not exist), ``data`` None
    deletes it, ``merge`` keeps the properties ``data`` does not name."""

    name: str
    data: dict[str, JSON] | None
    etag: str | None
    merge: bool = False


class Outcome(StrEnum):
    PROCESSED = "processed"  # effects committed with the marker, now
    DECLINED = "declined"  # a business "no" (Effects.declined) committed with the marker, now: acknowledge
    DUPLICATE = "duplicate"  # same key, same payload: nothing written, acknowledge
    IN_FLIGHT = "in_flight"  # another delivery holds a live claim: retry later
    CONFLICT = "conflict"  # same key, different payload: dead-lettered, alert raised
    INVALID = "invalid"  # can never be processed as sent: dead-lettered with reason
    TRANSIENT = "transient"  # nothing committed: let the broker redeliver
    STALE = "stale"  # an older version of state already superseded: acknowledge
    PARKED = "parked"  # still failing when its source moved on (Event Hubs): recorded for replay


RETRY_OUTCOMES = frozenset({Outcome.IN_FLIGHT, Outcome.TRANSIENT})


@dataclass(frozen=True)
class Delivery:
    """One delivery of a message, whatever the trigger. Only ``message_id`` (producer
    assigned) may feed the key; the rest is for logs and operators."""

    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    traceparent: str | None = None  # W3C trace context of the producer, when it sent one
    properties: Mapping[str, Any] = field(default_factory=dict)
    # Who sent it, where the channel lets anyone send (an HTTP caller): part of the
    # fingerprint, so one caller never replays, nor matches, another caller's request.
    origin: str | None = None
    # How long this delivery may wait inside its invocation for a transient failure to
    # clear; None: the consumer's DEDUP_TRANSIENT_WAIT (Service Bus, which redelivers at once).
    wait: timedelta | None = None
    # When the message was first enqueued, where it was sent again since (a resubmission keeps it):
    # what its age is measured from, so that a copy older than its marker can be is never applied.
    first_enqueued_at: datetime | None = None
    # How many times its source delivers it at most (a Storage queue's maxDequeueCount); None:
    # the consumer's DEDUP_MAX_DELIVERY_COUNT (every Service Bus queue's maxDeliveryCount).
    max_deliveries: int | None = None
    # Where the broker placed it (Service Bus): its sequence number, gap-free and increasing per
    # entity (per partition of a partitioned one), and when it was enqueued. Kept on the marker
    # or record the delivery leaves, for the audit (the audit package) to account for every message.
    sequence: int | None = None
    enqueued_at: datetime | None = None

    def is_last(self, max_deliveries: int) -> bool:
        """The source's last delivery (``max_deliveries`` unless it says its own): what still
        fails now is dead-lettered next."""
        limit = self.max_deliveries or max_deliveries
        return self.delivery_count is not None and self.delivery_count >= limit


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    key: DedupKey | None = None
    reason: str | None = None
    detail: str | None = None
    response: JSON = None  # what the handler answered (Effects.result), and what a replay answers again
    fingerprint: str | None = None
    stored_fingerprint: str | None = None
    # The message was declined (Effects.declined): now (``declined``), or a copy of one that was,
    # found so (``duplicate``); ``response`` then holds the decline's reason and detail.
    declined: bool = False

    @property
    def acknowledge(self) -> bool:
        """False: the trigger must make the broker redeliver (abandon / raise)."""
        return self.outcome not in RETRY_OUTCOMES


_TRANSIENT = {StoreUnavailable: Reason.STORE_UNAVAILABLE, DownstreamUnavailable: Reason.DOWNSTREAM_UNAVAILABLE,
              LeaseLost: Reason.LEASE_LOST}  # fmt: skip


def failure(exc: Exception, key: DedupKey | None, fp: str | None) -> Result:
    """The one outcome an error maps to (errors.py). Any other exception is a bug in the
    handler: logged, and retried, never acknowledged."""
    if isinstance(exc, InvalidMessage):
        return Result(Outcome.INVALID, key, exc.reason, exc.detail)
    if isinstance(exc, DownstreamRejected):
        return Result(Outcome.INVALID, key, Reason.DOWNSTREAM_REJECTED, str(exc)[:500])
    if isinstance(exc, FingerprintMismatch):
        return mismatch(key, fp or "", exc.stored_fingerprint)
    if isinstance(exc, InFlight):
        return Result(Outcome.IN_FLIGHT, key, Reason.CLAIMED_ELSEWHERE, "another delivery holds a live claim")
    for kind, reason in _TRANSIENT.items():  # subclasses too
        if isinstance(exc, kind):
            return Result(Outcome.TRANSIENT, key, reason, str(exc)[:500])
    log.error("dedup handler failed for %r", str(key), exc_info=exc)
    return Result(Outcome.TRANSIENT, key, Reason.HANDLER_ERROR, repr(exc)[:500])


def mismatch(key: DedupKey | None, fp: str, stored: str | None) -> Result:
    detail = "the key was already processed with a different payload"
    return Result(Outcome.CONFLICT, key, Reason.FINGERPRINT_MISMATCH, detail, fingerprint=fp, stored_fingerprint=stored)


_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a reason: a short code (a log field, a metric's dimension)


@dataclass(frozen=True)
class Declined:
    """A business "no" decided on what is stored ("insufficient stock", "sold out"): not an
    invalid message (``InvalidMessage``: it could never be valid as sent), but a decision,
    committed with the marker like any other, so that every later copy of the message gets the
    same answer whatever the stored state has become. ``reason``: a short code (logs, metrics,
    an HTTP problem's title); ``detail``: what to tell the sender ("3 seats asked, 2 left")."""

    reason: str
    detail: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not _CODE.fullmatch(self.reason) or not isinstance(self.detail, str):
            raise TypeError(f"Declined(reason, detail): a reason code ({_CODE.pattern}), and a detail text; "
                            f"not {self.reason!r}")  # fmt: skip

    @property
    def result(self) -> dict[str, str]:
        """What the marker stores as its result, and what a replay answers."""
        return {"reason": self.reason, "detail": self.detail}

    @staticmethod
    def of(result: JSON) -> Declined:
        """The decline a declined message's marker stores (``result``)."""
        return Declined(str(result["reason"]), str(result["detail"]))


@dataclass(frozen=True)
class Effects:
    """What a handler decides for one new message: the business entities to insert with
    the marker (one transaction), the changes of entities it read (``Stored.replaced``…, in
    the same transaction, each only at the version read), the result to store for replays, and
    the messages it sends — committed in the same transaction, sent after it (the outbox).
    ``declined``: the message is refused on what the handler read, and that decision is what
    the marker records (its result is the decline's reason and detail: ``result`` stays None);
    records, changes and messages the handler adds still commit with it."""

    entities: list[Entity] = field(default_factory=list)
    result: JSON = None
    messages: Sequence[Outgoing] = ()
    changes: Sequence[Change] = ()
    declined: Declined | None = None


@dataclass(frozen=True)
class Outgoing:
    """A message a handler sends: to ``destination`` (a queue or topic), ``body`` as JSON,
    with application ``properties`` and a ``session_id`` where the destination needs one.
    ``name`` tells it apart from the message's other outgoing ones (default: its position);
    with the consumer and the message's key it makes ``message_id``, which the consumer
    sets — the same on every re-send, so that duplicate detection and the next consumer's
    dedup recognise it."""

    destination: str
    body: JSON
    name: str = ""
    properties: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    session_id: str | None = None
    message_id: str = ""


@dataclass(frozen=True)
class LatestState:
    """Event-carried state transfer: the message holds the absolute state and its version.
    Applying it is naturally idempotent — written only when newer — so no dedup marker
    is written at all. Prefer this wherever the message can carry the whole state."""

    entity: Entity
    version: int
    result: JSON = None
