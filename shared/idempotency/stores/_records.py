"""What a store keeps and answers: markers and their states, what ``commit_many`` takes
and answers, dead-letter records, and what verifiers read back."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from ..keys import DedupKey
from ..messages import JSON, Change, Entity, Stored

MARKER_KIND = "dedup-marker"
GUARD_KIND = "dedup-guard"
LIBRARY_RECORD = "~"  # entity names the library writes beside the data (the outbox) start with it


class State(StrEnum):
    IN_PROGRESS = "in_progress"  # claimed; an external effect may be under way
    COMPLETED = "completed"  # effects committed; the result can be replayed
    DECLINED = "declined"  # a message its handler declined (Effects.declined): the result is the decline
    REFUSED = "refused"  # a step's call was refused for good (a final 4xx): never called again
    ESCALATED = "escalated"  # in progress long past its lease: operators were alerted, once


@dataclass(frozen=True)
class Marker:
    key: DedupKey
    partition: str
    state: State
    fingerprint: str
    created_at: datetime
    expires_at: datetime
    lease_until: datetime | None = None  # only while in progress
    owner: str | None = None  # the claim's token: tells our own lost write from a rival's
    result: JSON = None
    version: str | None = field(default=None, compare=False)  # the store's ETag
    # A claim resumed from an earlier attempt's that ended uncompleted (``DedupStore.claim``): that
    # attempt may have made the call. Not stored.
    resumed: bool = field(default=False, compare=False)
    # The delivery it records, as its broker placed it (Delivery.sequence, .enqueued_at): the audit's facts
    sequence: int | None = None
    enqueued_at: datetime | None = None
    # Who sent it, where anyone may send (an HTTP caller, Delivery.origin): part of its fingerprint,
    # kept so that a tool can compare a body with it as the commit compared it (resubmit)
    origin: str | None = None

    @property
    def claimed(self) -> bool:
        """Not final yet: in progress, escalated or not."""
        return self.state in (State.IN_PROGRESS, State.ESCALATED)

    @property
    def final(self) -> bool:
        return self.state in (State.COMPLETED, State.DECLINED, State.REFUSED)

    def finished(self, result: JSON, state: State = State.COMPLETED) -> Marker:
        """This claim made final (completed, or refused) with its result, still at its version."""
        return replace(self, state=state, lease_until=None, result=result)

    def reclaimable(self, now: datetime) -> bool:
        """An expired marker, or a claim whose owner's lease has run out, may be taken
        over — always with a write fenced by ``version``."""
        if self.expires_at <= now:
            return True
        return self.claimed and self.lease_until is not None and self.lease_until <= now


@dataclass(frozen=True)
class StoredItem:
    """One stored record as a verifier sees it. A Cosmos document that is its own marker
    has both a ``key`` and an ``entity``."""

    name: str  # RowKey / id, as stored
    kind: str | None  # MARKER_KIND, GUARD_KIND, or None for business data only
    key: DedupKey | None  # set on markers
    entity: str | None  # the business entity's name, set on business data
    data: dict[str, JSON]


class StateStatus(StrEnum):
    APPLIED = "applied"  # the incoming version was newer: written
    SAME = "same"  # this version is already stored, with the same data: a redelivery
    STALE = "stale"  # a newer version is stored: ignored
    CONFLICT = "conflict"  # this version is already stored with other data: nothing written


@dataclass(frozen=True)
class Purge:
    scanned: int
    deleted: int
    requests: int


class CommitStatus(StrEnum):
    NEW = "new"  # marker and effects committed together, just now
    DUPLICATE = "duplicate"  # a marker with the same fingerprint exists: nothing written
    MISMATCH = "mismatch"  # a marker with another fingerprint exists: nothing written
    REFUSED = "refused"  # the store can never hold this message's data (``detail`` says why): nothing written
    LEASE_LOST = "lease_lost"  # a step's claim changed since it was claimed (taken over): nothing written
    CONTENDED = "contended"  # an entity it changes moved since it was read: nothing written, decide again


@dataclass(frozen=True)
class CommitResult:
    status: CommitStatus
    stored_fingerprint: str | None = None
    detail: str | None = None
    # The marker read back when a conflict turned out to be this delivery's own earlier commit
    # (``NEW`` on a retry): what was committed, which the retry's own decision may not be.
    stored: Marker | None = None


@dataclass(frozen=True)
class DeadLetter:
    """What operators need to understand and resubmit a message the consumer refused: the
    full body (it may hold personal data), ids, reason and fingerprints. Kept for the
    store's ``dead_letter_retention`` (DEDUP_DEAD_LETTER_RETENTION), then deleted."""

    scope: str
    reason: str
    detail: str
    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    key_id: str | None = None
    fingerprint: str | None = None
    stored_fingerprint: str | None = None
    recorded_at: datetime | None = None
    # Set when the record keeps only the head of a body too large for it (_codec.py's
    # MAX_DEAD_LETTER_BODY): the whole body's length and SHA-256 (hex).
    body_size: int | None = None
    body_sha256: str | None = None
    sequence: int | None = None  # as on a marker: the delivery's place in its broker, for the audit
    enqueued_at: datetime | None = None

    @property
    def truncated(self) -> bool:
        """``body`` is only the head of the message's body: never resubmit or replay it as is."""
        return self.body_size is not None

    @property
    def record_id(self) -> str:
        """Deterministic, so that recording the same delivery twice writes one record. Of
        the record as the consumer made it: a truncated record read back has another."""
        digest = hashlib.sha256()
        for part in (self.scope, self.message_id or "", self.key_id or "", self.reason):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\x00")
        if self.sequence is not None:  # a producer's resend of a refused message is a record of its own
            digest.update(b"%d\x00" % self.sequence)
        digest.update(self.body)
        return digest.hexdigest()


class Commit(NamedTuple):
    """One message's marker and effects, as ``commit`` takes them. ``owner``: this
    delivery's token, stored in the marker; ``retry``: an earlier attempt of the same
    delivery may have been applied with its answer lost, so a conflict reads the marker
    to tell our own commit (``NEW``) from another delivery's (``DUPLICATE``).
    ``completions``: completed step markers to write in the same transaction, each only at
    its ``version`` (the claim's), on a store that ``folds_completions``. ``changes``: the
    state of each entity it changes once this message is applied (data None: deleted), only if
    the entity is still at the change's ``etag`` (None: it must not exist) — or, where an earlier
    commit of the same ``commit_many`` call changes it too, at the version that one wrote.
    ``state``: the marker's, ``COMPLETED`` or ``DECLINED`` (the handler declined the message)."""

    key: DedupKey
    partition: str
    fingerprint: str
    effects: Sequence[Entity]
    result: JSON
    expires_at: datetime
    owner: str | None = None
    retry: bool = False
    completions: tuple[Marker, ...] = ()
    changes: tuple[Change, ...] = ()
    sequence: int | None = None  # the delivery's place in its broker (Delivery.sequence), kept on the marker
    enqueued_at: datetime | None = None
    state: State = State.COMPLETED
    origin: str | None = None  # who sent it (Delivery.origin), kept on the marker

    def marker(self, now: datetime) -> Marker:
        return Marker(self.key, self.partition, self.state, self.fingerprint, now, self.expires_at,
                      owner=self.owner, result=self.result, sequence=self.sequence,
                      enqueued_at=self.enqueued_at, origin=self.origin)  # fmt: skip


class StoredState(NamedTuple):
    """What ``upsert_if_newer`` reads before it writes: the stored version, the ETag its
    conditional write is fenced by, the fingerprint of the stored data
    (``_codec.state_fingerprint``; None for a state written before it was kept), and the token
    of the delivery that wrote it (``owner``; None when none was given)."""

    version: int
    etag: str
    fingerprint: str | None = None
    owner: str | None = None


class Current(NamedTuple):
    """What ``read_current`` found in one partition: the markers of the keys asked for, and
    each entity asked for as stored (``Stored.data`` None when there is none)."""

    markers: dict[DedupKey, Marker]
    entities: dict[str, Stored]
