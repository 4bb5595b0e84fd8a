"""The store contract: the primitives every store implements, and the decisions built on
them, written once. Every store passes the same contract suite against its real server
(``shared.idempotency.testing``)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from ..config import DEAD_LETTER_RETENTION
from ..errors import AlreadyClaimed, StoreRefused, VersionConflict
from ..keys import DedupKey
from ..messages import JSON, Entity
from ._codec import state_fingerprint
from ._records import (
    Commit,
    CommitResult,
    CommitStatus,
    Current,
    DeadLetter,
    Marker,
    Purge,
    State,
    StateStatus,
    StoredItem,
    StoredState,
)


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
            if type(value) not in _SCALARS and not _storable(value, nested=False):
                raise TypeError(f"{effect.name}.{name}: a {type(value).__name__} is not a storable value")


_SCALARS = frozenset({str, float, bool, type(None), datetime, bytes})  # most values: stored as they are


def _storable(value: object, nested: bool) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _storable(v, True) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v, True) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63  # Int64; JSON's exact integers are far inside
    scalars = (str, float, bool) if nested else (str, float, bool, datetime, bytes)
    return value is None or isinstance(value, scalars)


class DedupStore(ABC):
    """Markers keyed by (consumer, message). A marker lives in the partition of the
    business data it guards, so that it commits with that data in one transaction.

    A new store implements the abstract primitives below — each one SDK call or a
    conditional write — and passes ``shared.idempotency.testing.StoreContract`` against
    its real server. The decisions built on them (what a conflict means, claims,
    completion, versioned upserts) are written once, here.

    Every primitive raises ``StoreUnavailable`` when the store could not be reached or
    answered that it is busy, throttled or failing (the delivery waits, then the broker
    redelivers), and never for a message's own data; what else each one raises or answers
    is on it."""

    dead_letter_retention: timedelta = DEAD_LETTER_RETENTION
    max_effects = 98  # business entities one commit holds: a transaction of 100 less guard and marker
    # True when ``commit_many`` writes ``Commit.completions`` in the commit's transaction, each
    # fenced by its version (CommitStatus.LEASE_LOST otherwise). False: steps complete on their own.
    folds_completions = False
    # True when the store reads (``read_current``) and commits ``Commit.changes``: a consumer
    # with ``reads`` needs it.
    commits_changes = False
    rows_per_read = 100  # markers and entities ``read_current`` reads in one request

    # -- the atomic path: one request claims and commits -------------------------------

    @abstractmethod
    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        """For each commit, insert a completed marker, its guard (key, fingerprint) and its
        effects — and, on a store that ``folds_completions``, replace each of its completions
        at its version; on one that ``commits_changes``, write each of its ``changes`` at its
        version — in one transaction, or nothing. When the transaction fails on an existing
        item, ``conflict`` says what that means; on a change's version, ``CONTENDED`` (and so is
        every later commit of the call whose change of the same entity followed it). A store
        may group commits that share a partition into fewer requests, each entity then written
        once per request, as the last of them leaves it.

        :returns: one ``CommitResult`` per commit, in order; ``REFUSED`` (``refused(exc)``)
            for a commit whose data the store can never hold, the others decided on their own.
        :raises StoreUnavailable: nothing was decided; any commit may have been applied
            (the caller resends with ``retry``)."""

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
            return CommitResult(CommitStatus.NEW, commit.fingerprint, stored=stored)  # ours: as it was committed
        if guard_exists:
            return CommitResult(CommitStatus.DUPLICATE, commit.fingerprint)
        if stored is None or stored.fingerprint == commit.fingerprint:
            return CommitResult(CommitStatus.DUPLICATE, stored.fingerprint if stored else None)
        return CommitResult(CommitStatus.MISMATCH, stored.fingerprint)

    def read_current(self, partition: str, keys: Sequence[DedupKey], names: Sequence[str]) -> Current:
        """The markers of ``keys`` and the entities ``names`` of one partition, each entity
        with the version (ETag) a change of it is conditioned on: in as few requests as the
        store allows (one, for a message and a few entities). Needed by ``commits_changes``.

        :raises StoreUnavailable: as every primitive."""
        raise NotImplementedError(f"{type(self).__name__} does not read entities for changes")

    # -- primitives of the two-phase path ------------------------------------------------

    @abstractmethod
    def get(self, key: DedupKey, partition: str) -> Marker | None:
        """The marker with its ``version``, or None.

        :raises StoreUnavailable: as every primitive."""

    @abstractmethod
    def insert(self, marker: Marker) -> Marker | None:
        """Conditional insert.

        :returns: the stored marker with its ``version``; None when one exists for the key.
        :raises StoreUnavailable: the insert may have been applied (``claim`` reads it back)."""

    @abstractmethod
    def replace(self, marker: Marker, if_version: str) -> Marker:
        """Overwrite a marker only at ``if_version``.

        :returns: the stored marker with its new ``version``.
        :raises VersionConflict: the marker is at another version, or gone.
        :raises StoreUnavailable: as every primitive."""

    @abstractmethod
    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        """In-progress markers whose lease ran out before the given time, at most ``limit``.

        :raises StoreUnavailable: as every primitive."""

    # -- primitives of naturally idempotent writes: no marker ----------------------------

    def sequenced(self, scope: str, since: datetime, until: datetime) -> list[Marker]:
        """The markers of consumer ``scope`` and of its own scopes (``scope|…``) whose delivery
        was enqueued in [``since``, ``until``): the audit's facts (the audit package). A filtered scan across
        partitions: run it from a timer, never on the message path.

        :raises StoreUnavailable: as every primitive."""
        raise NotImplementedError(f"{type(self).__name__} does not list markers by enqueued time")

    @abstractmethod
    def read_state(self, partition: str, name: str) -> StoredState | None:
        """The stored version of entity ``name`` (-1 when it has none), its ETag, and the
        fingerprint and owner ``write_state`` stored with it (None when it has none), or None.

        :raises StoreUnavailable: as every primitive."""

    @abstractmethod
    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        """Write ``entity`` with ``version``, the ``state_fingerprint`` of its data (for
        ``same_state``) and ``owner`` (the writer's token, when given: its retry after a lost
        answer knows its own write): create it (``if_etag`` None) or replace it at ``if_etag``.

        :returns: False when another writer got there first (it exists, or its ETag moved).
        :raises StoreRefused: the store can never hold this entity.
        :raises TypeError: a value no store holds (``check_storable``); nothing written.
        :raises StoreUnavailable: as every primitive."""

    def same_state(self, partition: str, entity: Entity, stored: StoredState) -> bool:
        """Whether the state stored at ``entity``'s version holds ``entity``'s data: by the
        fingerprint ``write_state`` stored with it.

        :raises TypeError: a value no store holds."""
        return stored.fingerprint == state_fingerprint(entity.data)

    # -- operators' records --------------------------------------------------------------

    @abstractmethod
    def dead_letter(self, record: DeadLetter) -> None:
        """Record a refused message durably (idempotent by ``record.record_id``), to be
        deleted ``dead_letter_retention`` after it was recorded, as ``_codec.kept(record)``:
        a body of up to ``MAX_DEAD_LETTER_BODY`` bytes whole, a longer one as its head with
        its length and SHA-256 (the record's ``truncated``). Written at once or not at all:
        never half a record.

        :raises StoreUnavailable: not recorded (unreachable, throttled): the delivery fails
            and the source keeps the message, as far as it keeps any. Never for the
            record's size."""

    @abstractmethod
    def dead_letters(self, scope: str) -> list[DeadLetter]:
        """The dead-letter records of one consumer (``scope``), each with its body as kept,
        for operators, tools and tests.

        :raises StoreUnavailable: as every primitive."""

    # -- the library's own records beside the data (the outbox) ---------------------------

    @abstractmethod
    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        """Entities of ``partition`` whose name starts with ``prefix`` (all with ""), in
        name order, at most ``limit``: one range read, never a scan of other partitions.
        Markers and guards are not entities.

        :raises StoreUnavailable: as every primitive."""

    @abstractmethod
    def put_entity(self, partition: str, entity: Entity) -> None:
        """Create or replace one entity.

        :raises StoreRefused: the store can never hold this entity.
        :raises StoreUnavailable: as every primitive."""

    @abstractmethod
    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        """Delete these entities; one already gone is not an error.

        :raises StoreUnavailable: as every primitive; some may have been deleted."""

    def check_effects(self, effects: Sequence[Entity]) -> None:
        """What this store can never hold, found before anything is sent: a commit calls it
        for each message (only that message is refused), and so does a resubmit's dry run.

        :raises TypeError: a value no store holds (``check_storable``).
        :raises StoreRefused: an entity over this store's own limits."""
        check_storable(effects)

    # -- lifecycle and verification ------------------------------------------------------

    def purge_expired(self, now: datetime, budget: int, *, deadline: float | None = None) -> Purge:
        """Delete markers, guards and dead-letter records that expired before ``now`` (a store
        may wait for whole hours to pass), ``budget`` of them at most, stopping at
        ``deadline`` (``time.monotonic()``); never a business entity. Its cost must follow
        what expired, not the store's size. This default is for stores with native TTL."""
        return Purge(0, 0, 0)

    def sweep_expired(self, now: datetime, budget: int) -> Purge:
        """The rare full sweep behind ``purge_expired``: whatever expired and it missed, found
        by scanning. This default is for stores whose purge misses nothing."""
        return Purge(0, 0, 0)

    def check_tables(self) -> None:
        """Each table (container) the store uses exists: read, never created — what an
        operator's command checks before it reads or writes anything. This default is for
        stores without tables to check (memory).

        :raises ConfigurationError: one does not exist (named).
        :raises StoreUnavailable: as every primitive."""
        return None

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        """Every stored record (of one partition, or all): for the contract suite, checkers
        and the resubmit tool, never for the message path."""
        raise NotImplementedError(f"{type(self).__name__} cannot be inspected")

    # -- built on the primitives ---------------------------------------------------------

    def upsert_if_newer(self, partition: str, entity: Entity, version: int, *, owner: str | None = None) -> StateStatus:
        """Write the absolute state only when ``version`` is newer than the stored one,
        with a write conditional on what was read, never a blind read-modify-write: of
        concurrent writers the highest version wins. ``owner``: the delivery's token, written
        with the state, so that its retry after a lost answer finds its own write: ``APPLIED``.

        :returns: ``APPLIED`` (written, by this ``owner``), ``STALE`` (a newer version is stored), ``SAME``
            (this version is stored with equal data: a redelivery) or ``CONFLICT`` (this
            version is stored with other data: nothing written, the stored state kept).
        :raises TypeError: a value no store holds; nothing written.
        :raises StoreRefused: the store can never hold this entity.
        :raises StoreUnavailable: as every primitive."""
        while True:  # each pass either writes conditionally or learns what is stored
            current = self.read_state(partition, entity.name)
            if current is not None and current.version > version:
                return StateStatus.STALE
            if current is not None and current.version == version:
                if not self.same_state(partition, entity, current):
                    return StateStatus.CONFLICT
                ours = owner is not None and current.owner == owner
                return StateStatus.APPLIED if ours else StateStatus.SAME
            if self.write_state(partition, entity, version, current.etag if current else None, owner=owner):
                return StateStatus.APPLIED

    def complete(self, marker: Marker, result: JSON, state: State = State.COMPLETED) -> Marker:
        """Make a claim final (completed, or refused) with its result, only if the marker
        is still at ``marker.version``: one conditional replace of one item, since a
        step's completion carries no business effects."""
        if marker.version is None:
            raise VersionConflict("only a stored marker can be completed")
        return self.replace(marker.finished(result, state), marker.version)

    def claim(self, marker: Marker, now: datetime) -> Marker:
        """Claim ``marker.key`` in progress. A live marker raises AlreadyClaimed; an
        expired one (or one whose lease ran out, for the same payload) is taken over with
        a write fenced by its version, so that of two workers racing for the same stale
        marker exactly one wins. ``resumed`` on the claim returned: it continues an earlier
        attempt's claim of the same payload, never completed, whose call may have been made."""
        assert marker.state is State.IN_PROGRESS
        for _ in range(3):  # the existing marker may vanish between insert and read
            created = self.insert(marker)
            if created is not None:
                return created
            existing = self.get(marker.key, marker.partition)
            if existing is None:
                continue
            # An earlier attempt's claim of this payload, not completed: it may have made the call
            resumed = existing.claimed and existing.fingerprint == marker.fingerprint
            ours = marker.owner is not None and existing.owner == marker.owner and existing.claimed
            if ours and not existing.reclaimable(now):
                # our own insert, whose response was lost, or this delivery's earlier attempt
                return dataclasses.replace(existing, resumed=True)
            other_payload = existing.fingerprint != marker.fingerprint and existing.expires_at > now
            if other_payload or not existing.reclaimable(now) or existing.version is None:
                raise AlreadyClaimed(existing)  # a different payload never takes a claim over
            try:  # a lapsed claim, even our own, is taken back with a new lease: fenced
                return dataclasses.replace(self.replace(marker, existing.version), resumed=resumed)
            except VersionConflict:
                raise AlreadyClaimed(self.get(marker.key, marker.partition) or existing) from None
        raise AlreadyClaimed(None)
