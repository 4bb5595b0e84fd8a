"""The store contract: the primitives every store implements, and the decisions built on
them, written once. Every store passes the same contract suite against its real server
(``shared.idempotency.testing``)."""

from __future__ import annotations

import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from ..errors import AlreadyClaimed, StoreRefused, StoreUnavailable, VersionConflict
from ..keys import DedupKey
from ..records import JSON, Entity, Marker, State, StoredItem

log = logging.getLogger("idempotency")


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
    REFUSED = "refused"  # the store can never hold this message's data (``detail`` says why): nothing written


@dataclass(frozen=True)
class CommitResult:
    status: CommitStatus
    stored_fingerprint: str | None = None
    detail: str | None = None


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


def refused(exc: Exception) -> CommitResult:
    """The commit result of a message whose data the store can never hold: the store
    refused it (StoreRefused), or our own encoding could not hold a value."""
    detail = exc.detail if isinstance(exc, StoreRefused) else f"cannot be stored: {exc}"[:500]
    return CommitResult(CommitStatus.REFUSED, detail=detail)


def check_storable(effects: Sequence[Entity]) -> None:
    """TypeError unless every value is one both real stores hold: JSON values, and times
    and bytes at the top level. Checked before anything is sent, so that a type error
    from deeper down (an SDK, a transport) is never mistaken for the message's data."""
    for effect in effects:
        for name, value in effect.data.items():
            if not _storable(value, nested=False):
                raise TypeError(f"{effect.name}.{name}: a {type(value).__name__} is not a storable value")


def _storable(value: object, nested: bool) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _storable(v, True) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v, True) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63  # Int64; JSON's exact integers are far inside
    scalars = (str, float, bool) if nested else (str, float, bool, datetime, bytes)
    return value is None or isinstance(value, scalars)


class Commit(NamedTuple):
    """One message's marker and effects, as ``commit`` takes them. ``owner``: this
    delivery's token, stored in the marker; ``retry``: an earlier attempt of the same
    delivery may have been applied with its answer lost, so a conflict reads the marker
    to tell our own commit (``NEW``) from another delivery's (``DUPLICATE``)."""

    key: DedupKey
    partition: str
    fingerprint: str
    effects: Sequence[Entity]
    result: JSON
    expires_at: datetime
    owner: str | None = None
    retry: bool = False

    def marker(self, now: datetime) -> Marker:
        return Marker(self.key, self.partition, State.COMPLETED, self.fingerprint, now, self.expires_at,
                      owner=self.owner, result=self.result)  # fmt: skip


class StoredState(NamedTuple):
    """What ``upsert_if_newer`` reads before it writes: the stored version and the ETag
    its conditional write is fenced by."""

    version: int
    etag: str


def is_transient(status: int | None) -> bool:
    """Throttling, timeouts and server errors (Cosmos DB's 449 "retry with" included)."""
    return status in (408, 429, 449) or (status or 0) >= 500


# What a store answers about a message's own data (a value, an entity, a request too large;
# the same row twice in one transaction): refused for good. Any other 400 may be a
# deployment's mistake (an API version, a header, an account setting): never dead-letter for it.
REFUSED_FOR_GOOD = frozenset({"PropertyValueTooLarge", "EntityTooLarge", "PropertyNameTooLong", "TooManyProperties",
                              "KeyValueTooLarge", "InvalidDuplicateRow", "RequestBodyTooLarge"})  # fmt: skip
DATA_ROLES = "Table Storage: 'Storage Table Data Contributor'; Cosmos DB: 'Cosmos DB Built-in Data Contributor'"


@contextmanager
def store_errors() -> Iterator[None]:
    """Map what the SDKs could not get through (after their own retries) to one outcome.
    Both SDKs raise azure-core's errors (Cosmos DB's are subclasses):

    - unreachable, throttled, 5xx → StoreUnavailable: wait, then let the broker redeliver;
    - 401/403 → StoreUnavailable too, logged with the role the app's identity most likely
      lacks: a missing role assignment is fixed by an operator, not by dead-lettering;
    - 413, or a 400 whose code says the data is too large (REFUSED_FOR_GOOD) → StoreRefused:
      this message's data can never be stored; dead-letter it;
    - any other 400 → StoreUnavailable, logged: likely the deployment's, not the message's;
    - anything else (404 on a read, 409, 412) passes through: the callers read those."""
    try:
        yield
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise StoreUnavailable(str(exc)) from exc
    except HttpResponseError as exc:
        code = getattr(exc, "error_code", None) or ""
        code = str(getattr(code, "value", code))  # the SDK's may be an enum
        if is_transient(exc.status_code):
            raise StoreUnavailable(f"{exc.status_code} {code}: {exc.message}") from exc
        if isinstance(exc, ClientAuthenticationError) or exc.status_code in (401, 403):
            log.error("dedup store refused access (%s %s): grant the app's identity a data role (%s)",
                      exc.status_code, code, DATA_ROLES)  # fmt: skip
            raise StoreUnavailable(f"{exc.status_code} {code}: access refused ({DATA_ROLES})") from exc
        if exc.status_code == 413 or (exc.status_code == 400 and code in REFUSED_FOR_GOOD):
            raise StoreRefused(f"{exc.status_code} {code}: {exc.message}"[:500]) from exc
        if exc.status_code == 400:
            log.error("dedup store answered 400 %s, not about a message's data: check the deployment", code)
            raise StoreUnavailable(f"400 {code}: {exc.message}"[:500]) from exc
        raise


class DedupStore(ABC):
    """Markers keyed by (consumer, message). A marker lives in the partition of the
    business data it guards, so that it commits with that data in one transaction.

    A new store implements the abstract primitives below — each one SDK call or a
    conditional write — and passes ``shared.idempotency.testing.StoreContract`` against
    its real server. The decisions built on them (what a conflict means, claims,
    completion, versioned upserts) are written once, here."""

    dead_letter_retention: timedelta = DEFAULT_DEAD_LETTER_RETENTION
    max_effects = 98  # business entities one commit holds: a transaction of 100 less guard and marker

    # -- the atomic path: one request claims and commits -------------------------------

    @abstractmethod
    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        """For each commit, insert a completed marker, its guard (key, fingerprint) and its
        effects in one transaction, or nothing. When the transaction fails on an existing
        item, ``conflict`` says what that means. A store may group commits that share a
        partition into fewer requests."""

    def commit(
        self,
        key: DedupKey,
        partition: str,
        fingerprint: str,
        effects: Sequence[Entity],
        result: JSON,
        expires_at: datetime,
    ) -> CommitResult:
        return self.commit_many([Commit(key, partition, fingerprint, effects, result, expires_at)])[0]

    def conflict(self, commit: Commit, guard_exists: bool) -> CommitResult:
        """A commit hit an existing item. Its guard: the same payload was committed. Else
        one read of the marker decides; no marker at all means a business entity
        outlived its marker (purged after retention): applied, never written twice.
        A retry reads the marker in any case: it may hold our own earlier attempt."""
        if guard_exists and not commit.retry:
            return CommitResult(CommitStatus.DUPLICATE, commit.fingerprint)
        stored = self.get(commit.key, commit.partition)
        if stored is not None and commit.owner is not None and stored.owner == commit.owner:
            return CommitResult(CommitStatus.NEW, commit.fingerprint)
        if guard_exists:
            return CommitResult(CommitStatus.DUPLICATE, commit.fingerprint)
        if stored is None or stored.fingerprint == commit.fingerprint:
            return CommitResult(CommitStatus.DUPLICATE, stored.fingerprint if stored else None)
        return CommitResult(CommitStatus.MISMATCH, stored.fingerprint)

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

    # -- primitives of naturally idempotent writes: no marker ----------------------------

    @abstractmethod
    def read_state(self, partition: str, name: str) -> StoredState | None:
        """The stored version of entity ``name`` (-1 when it has none), or None."""

    @abstractmethod
    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None) -> bool:
        """Write ``entity`` with ``version``: create it (``if_etag`` None) or replace it at
        ``if_etag``. False when another writer got there first."""

    # -- operators' records --------------------------------------------------------------

    @abstractmethod
    def dead_letter(self, record: DeadLetter) -> None:
        """Record a refused message durably (idempotent by ``record.record_id``), to be
        deleted ``dead_letter_retention`` after it was recorded."""

    @abstractmethod
    def dead_letters(self, scope: str) -> list[DeadLetter]: ...

    # -- lifecycle and verification ------------------------------------------------------

    def purge_expired(self, now: datetime, budget: int) -> Purge:
        """Delete markers, guards and dead-letter records that expired before ``now``, at
        most ``budget`` of them; never a business entity. This default is for stores
        with native TTL."""
        return Purge(0, 0, 0)

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        """Every stored record (of one partition, or all): for the contract suite, checkers
        and the resubmit tool, never for the message path."""
        raise NotImplementedError(f"{type(self).__name__} cannot be inspected")

    # -- built on the primitives ---------------------------------------------------------

    def upsert_if_newer(self, partition: str, entity: Entity, version: int) -> StateStatus:
        """Write the absolute state only when ``version`` is newer than the stored one,
        with a write conditional on what was read, never a blind read-modify-write: of
        concurrent writers the highest version wins."""
        while True:  # each pass either writes conditionally or learns what is stored
            current = self.read_state(partition, entity.name)
            if current is not None and current.version >= version:
                return StateStatus.SAME if current.version == version else StateStatus.STALE
            if self.write_state(partition, entity, version, current.etag if current else None):
                return StateStatus.APPLIED

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
