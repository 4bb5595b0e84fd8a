"""The store contract. Every store implements the same primitives and passes the same
contract test suite against a real server (tests/integration/test_store_contract.py)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from .errors import AlreadyClaimed, VersionConflict
from .keys import DedupKey
from .records import JSON, Entity, Marker, State, StoredItem


class StateStatus(StrEnum):
    APPLIED = "applied"  # the incoming version was newer: written
    SAME = "same"  # this version is already stored: a redelivery
    STALE = "stale"  # a newer version is stored: ignored


@dataclass(frozen=True)
class Purge:
    scanned: int
    deleted: int
    requests: int


class CommitStatus(StrEnum):
    NEW = "new"  # marker and effects committed together, just now
    DUPLICATE = "duplicate"  # a marker with the same fingerprint exists: nothing written
    MISMATCH = "mismatch"  # a marker with another fingerprint exists: nothing written


@dataclass(frozen=True)
class CommitResult:
    status: CommitStatus
    stored_fingerprint: str | None = None


DEFAULT_DEAD_LETTER_RETENTION = timedelta(days=14)


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

    @property
    def record_id(self) -> str:
        """Deterministic, so that recording the same delivery twice writes one record."""
        digest = hashlib.sha256()
        for part in (self.scope, self.message_id or "", self.key_id or "", self.reason):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\x00")
        digest.update(self.body)
        return digest.hexdigest()


class Commit(NamedTuple):
    """The arguments of ``commit``, named: one message's marker and effects."""

    key: DedupKey
    partition: str
    fingerprint: str
    effects: Sequence[Entity]
    result: JSON
    expires_at: datetime


class DedupStore(ABC):
    """Markers keyed by (consumer, message). A marker lives in the partition of the
    business data it guards, so that it commits with that data in one transaction."""

    # -- the atomic path: one request claims and commits -------------------------------

    @abstractmethod
    def commit(
        self,
        key: DedupKey,
        partition: str,
        fingerprint: str,
        effects: Sequence[Entity],
        result: JSON,
        expires_at: datetime,
    ) -> CommitResult:
        """Insert a completed marker and the effects in one transaction, or nothing."""

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        """Several commits at once (a batch trigger). This default commits them one by
        one; a store may group those that share a partition into fewer requests."""
        return [self.commit(*commit) for commit in commits]  # a Commit is commit()'s arguments, in order

    # -- primitives of the two-phase path ------------------------------------------------

    @abstractmethod
    def get(self, key: DedupKey, partition: str) -> Marker | None: ...

    @abstractmethod
    def insert(self, marker: Marker) -> Marker | None:
        """Conditional insert; None when a marker for the key already exists."""

    @abstractmethod
    def replace(self, marker: Marker, if_version: str) -> Marker:
        """Overwrite a marker only at ``if_version``; VersionConflict otherwise."""

    @abstractmethod
    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        """In-progress markers whose lease ran out before the given time (a bounded scan)."""

    # -- naturally idempotent writes: no marker ----------------------------------------

    @abstractmethod
    def upsert_if_newer(self, partition: str, entity: Entity, version: int) -> StateStatus:
        """Write the absolute state only when ``version`` is newer than the stored one,
        with a write conditional on what was read (ETag), never a blind read-modify-write:
        of concurrent writers the highest version wins."""

    # -- lifecycle -----------------------------------------------------------------------

    @abstractmethod
    def purge_expired(self, now: datetime, budget: int) -> Purge:
        """Delete markers, guards and dead-letter records that expired before ``now``, at
        most ``budget`` of them; never a business entity. A no-op where the store has
        native TTL."""

    # -- operators' records --------------------------------------------------------------

    dead_letter_retention: timedelta = DEFAULT_DEAD_LETTER_RETENTION
    max_effects = 98  # business entities one commit holds: a transaction of 100 less guard and marker

    @abstractmethod
    def dead_letter(self, record: DeadLetter) -> None:
        """Record a refused message durably (idempotent by ``record.record_id``), to be
        deleted ``dead_letter_retention`` after it was recorded."""

    @abstractmethod
    def dead_letters(self, scope: str) -> list[DeadLetter]: ...

    # -- verification ------------------------------------------------------------------

    @abstractmethod
    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        """Every stored record (of one partition, or all): for reports and checkers,
        never for the message path."""

    # -- built on the primitives ---------------------------------------------------------

    def complete(self, marker: Marker, result: JSON, state: State = State.COMPLETED) -> Marker:
        """Make a claim final (completed, or refused) with its result, only if the marker
        is still at ``marker.version``: one conditional replace of one item, since a
        step's completion carries no business effects."""
        if marker.version is None:
            raise VersionConflict("only a stored marker can be completed")
        done = replace(marker, state=state, lease_until=None, result=result)
        return self.replace(done, marker.version)

    def claim(self, marker: Marker, now: datetime) -> Marker:
        """Claim ``marker.key`` in progress. A live marker raises AlreadyClaimed; an
        expired one (or one whose lease ran out, for the same payload) is taken over with
        a write fenced by its version, so that of two workers racing for the same stale
        marker exactly one wins."""
        assert marker.state is State.IN_PROGRESS
        for _ in range(3):  # the existing marker may vanish between insert and read
            created = self.insert(marker)
            if created is not None:
                return created
            existing = self.get(marker.key, marker.partition)
            if existing is None:
                continue
            if marker.owner is not None and existing.owner == marker.owner and existing.claimed:
                return existing  # our own insert, whose response was lost and retried
            other_payload = existing.fingerprint != marker.fingerprint and existing.expires_at > now
            if other_payload or not existing.reclaimable(now) or existing.version is None:
                raise AlreadyClaimed(existing)  # a different payload never takes a claim over
            try:
                return self.replace(marker, existing.version)
            except VersionConflict:
                raise AlreadyClaimed(self.get(marker.key, marker.partition) or existing) from None
        raise AlreadyClaimed(None)
