"""A store in memory, for unit tests of handlers and of stores' callers. It passes the
same contract suite as the real stores, but proves nothing about Table Storage or Cosmos
DB: their transactions, ETags and limits are only proven against their servers."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from ..config import DEAD_LETTER_RETENTION
from ..errors import StoreRefused, StoreUnavailable, VersionConflict
from ..keys import DedupKey, encode_key, guard_id, marker_id
from ..messages import Change, Entity, Stored, utcnow
from ._base import DedupStore, check_storable, refused
from ._codec import kept, state_fingerprint
from ._records import (
    GUARD_KIND,
    MARKER_KIND,
    Commit,
    CommitResult,
    CommitStatus,
    Current,
    DeadLetter,
    Marker,
    Purge,
    State,
    StoredItem,
    StoredState,
)

STATE_VERSION = "stateVersion"
STATE_FINGERPRINT = "stateFingerprint"  # of the data written with a version (state_fingerprint)
STATE_OWNER = "stateOwner"  # the token of the delivery that wrote it


@dataclass(frozen=True)
class _Item:
    etag: str
    kind: str | None = None  # MARKER_KIND, GUARD_KIND, or None for business data
    marker: Marker | None = None
    entity: str | None = None
    data: dict[str, Any] | None = None
    expires_at: datetime | None = None


class MemoryStore(DedupStore):
    """``available = False`` makes every call fail as an unreachable store does."""

    folds_completions = True
    commits_changes = True

    def __init__(self, *, dead_letter_retention: timedelta = DEAD_LETTER_RETENTION) -> None:
        self.dead_letter_retention = dead_letter_retention
        self.available = True
        self._lock = threading.Lock()
        self._etags = itertools.count(1)
        self._items: dict[tuple[str, str], _Item] = {}  # (partition, id)
        self._dead: dict[tuple[str, str], tuple[DeadLetter, datetime]] = {}  # (scope, record id)

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("the in-memory store is marked unavailable")

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    # -- atomic path ---------------------------------------------------------------------

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        chained: dict[tuple[str, str], str | None] = {}  # (partition, entity): the version this call wrote
        return [self._commit(commit, chained) for commit in commits]

    def _commit(self, commit: Commit, chained: dict[tuple[str, str], str | None]) -> CommitResult:
        self._check()
        key, partition, fingerprint, effects, expires_at = (commit.key, commit.partition, commit.fingerprint,
                                                            commit.effects, commit.expires_at)  # fmt: skip
        names = [encode_key(effect.name) for effect in effects]
        size = len(effects) + len({change.name for change in commit.changes}) + len(commit.completions)
        if size > self.max_effects or len(set(names)) < len(names):
            raise ValueError(f"a commit holds at most {self.max_effects} entities, changes and steps, each name once")
        try:
            self.check_effects(effects)  # what the real stores' encoders refuse
        except (TypeError, StoreRefused) as exc:
            return refused(exc)
        guard = guard_id(key, fingerprint)
        with self._lock:
            taken = [i for i in (guard, marker_id(key), *names) if (partition, i) in self._items]
            if not taken:
                if not self._at_versions(partition, commit.changes, chained):
                    for change in commit.changes:  # what follows it in this call is decided again too
                        chained[(partition, change.name)] = "(contended)"
                    return CommitResult(CommitStatus.CONTENDED)
                for step in commit.completions:
                    current = self._items.get((step.partition, marker_id(step.key)))
                    if current is None or current.etag != step.version:
                        return CommitResult(CommitStatus.LEASE_LOST)
                for step in commit.completions:
                    self._put(step)
                marker = commit.marker(utcnow())
                self._items[(partition, guard)] = _Item(self._etag(), GUARD_KIND, expires_at=expires_at)
                self._items[(partition, marker_id(key))] = _Item(self._etag(), MARKER_KIND, marker)
                for name, effect in zip(names, effects, strict=True):
                    self._items[(partition, name)] = _Item(self._etag(), entity=effect.name, data=dict(effect.data))
                for change in commit.changes:
                    place = (partition, encode_key(change.name))
                    if change.data is None:
                        self._items.pop(place, None)
                        chained[(partition, change.name)] = None
                    else:
                        self._items[place] = _Item(self._etag(), entity=change.name, data=dict(change.data))
                        chained[(partition, change.name)] = self._items[place].etag
                return CommitResult(CommitStatus.NEW, fingerprint)
        for change in commit.changes:
            chained[(partition, change.name)] = "(contended)"
        return self.conflict(commit, guard_exists=taken[0] == guard)

    def _at_versions(
        self, partition: str, changes: Sequence[Change], chained: dict[tuple[str, str], str | None]
    ) -> bool:
        """Every entity still at the version its change was read at (or this call last wrote)."""
        for change in changes:
            expected = chained.get((partition, change.name), change.etag)
            current = self._items.get((partition, encode_key(change.name)))
            if (current.etag if current else None) != expected:
                return False
        return True

    def read_current(self, partition: str, keys: Sequence[DedupKey], names: Sequence[str]) -> Current:
        self._check()
        with self._lock:
            markers = {key: replace(item.marker, version=item.etag) for key in keys
                       if (item := self._items.get((partition, marker_id(key)))) and item.marker}  # fmt: skip
            entities = {}
            for name in names:
                item = self._items.get((partition, encode_key(name)))
                found = item is not None and item.entity is not None
                entities[name] = Stored(name, dict(item.data or {}) if found and item else None,
                                        item.etag if found and item else None)  # fmt: skip
        return Current(markers, entities)

    # -- two-phase primitives ------------------------------------------------------------

    def get(self, key: DedupKey, partition: str) -> Marker | None:
        self._check()
        item = self._items.get((partition, marker_id(key)))
        return replace(item.marker, version=item.etag) if item and item.marker else None

    def insert(self, marker: Marker) -> Marker | None:
        self._check()
        with self._lock:
            if (marker.partition, marker_id(marker.key)) in self._items:
                return None
            return self._put(marker)

    def replace(self, marker: Marker, if_version: str) -> Marker:
        self._check()
        with self._lock:
            current = self._items.get((marker.partition, marker_id(marker.key)))
            if current is None or current.etag != if_version:
                raise VersionConflict("the marker changed or vanished")
            return self._put(marker)

    def _put(self, marker: Marker) -> Marker:
        item = _Item(self._etag(), MARKER_KIND, replace(marker, version=None))
        self._items[(marker.partition, marker_id(marker.key))] = item
        return replace(marker, version=item.etag)

    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        self._check()
        found = [
            replace(item.marker, version=item.etag)
            for item in list(self._items.values())
            if item.marker and item.marker.state is State.IN_PROGRESS
            and item.marker.lease_until is not None and item.marker.lease_until < lease_expired_before
        ]  # fmt: skip
        return found[:limit]

    def sequenced(self, scope: str, since: datetime, until: datetime) -> list[Marker]:
        self._check()
        return [replace(item.marker, version=item.etag) for item in list(self._items.values())
                if item.marker and item.marker.enqueued_at is not None and since <= item.marker.enqueued_at < until
                and item.marker.key.scope.split("|", 1)[0] == scope]  # fmt: skip

    # -- naturally idempotent writes ----------------------------------------------------

    def read_state(self, partition: str, name: str) -> StoredState | None:
        self._check()
        item = self._items.get((partition, encode_key(name)))
        if item is None:
            return None
        data = item.data or {}
        return StoredState(int(data.get(STATE_VERSION, -1)), item.etag, data.get(STATE_FINGERPRINT),
                           data.get(STATE_OWNER))  # fmt: skip

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        self._check()
        place = (partition, encode_key(entity.name))
        data = {**entity.data, STATE_VERSION: version, STATE_FINGERPRINT: state_fingerprint(entity.data),
                **({STATE_OWNER: owner} if owner else {})}  # fmt: skip
        with self._lock:
            current = self._items.get(place)
            if (current.etag if current else None) != if_etag:
                return False
            self._items[place] = _Item(self._etag(), entity=entity.name, data=data)
            return True

    # -- the library's own records beside the data ------------------------------------------

    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        self._check()
        found = sorted((item.entity, item.data or {}) for (p, _), item in list(self._items.items())
                       if p == partition and item.entity is not None and item.entity.startswith(prefix))  # fmt: skip
        return [Entity(name, dict(data)) for name, data in found[:limit]]

    def put_entity(self, partition: str, entity: Entity) -> None:
        self._check()
        check_storable([entity])
        with self._lock:
            self._items[(partition, encode_key(entity.name))] = _Item(self._etag(), entity=entity.name,
                                                                      data=dict(entity.data))  # fmt: skip

    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        self._check()
        with self._lock:
            for name in names:
                self._items.pop((partition, encode_key(name)), None)

    # -- dead letters and lifecycle ------------------------------------------------------

    def dead_letter(self, record: DeadLetter) -> None:
        self._check()
        recorded = record.recorded_at or utcnow()
        stored = replace(kept(record), recorded_at=recorded)
        self._dead[(record.scope, record.record_id)] = (stored, recorded + self.dead_letter_retention)

    def dead_letters(self, scope: str) -> list[DeadLetter]:
        self._check()
        return [record for (s, _), (record, _) in list(self._dead.items()) if s == scope]

    def purge_expired(self, now: datetime, budget: int, *, deadline: float | None = None) -> Purge:
        self._check()
        with self._lock:
            items = [place for place, item in self._items.items() if (_expiry(item) or now) < now]
            dead = [place for place, (_, expires) in self._dead.items() if expires < now]
            for place in items[:budget]:
                del self._items[place]
            for place in dead[: max(0, budget - len(items))]:
                del self._dead[place]
        deleted = min(budget, len(items) + len(dead))
        return Purge(len(self._items) + len(self._dead) + deleted, deleted, 0)

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        self._check()
        for (p, name), item in list(self._items.items()):
            if partition is None or p == partition:
                data = dict(item.data or {})
                yield StoredItem(name, item.kind, item.marker.key if item.marker else None, item.entity, data)


def _expiry(item: _Item) -> datetime | None:
    return item.marker.expires_at if item.marker else item.expires_at
