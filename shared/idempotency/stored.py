"""What the handlers of one partition read in one attempt, and how their changes fold: each
handler sees the entities as the previous message of the attempt left them, and each commit
carries the state it leaves, conditioned on the version read — so that messages of one
partition (a batch) commit together, one write per entity, and a change made meanwhile by
anyone else refuses the lot (``CONTENDED``), which is then decided again from a fresh read."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from .keys import DedupKey
from .messages import JSON, Change, Stored
from .stores._base import DedupStore
from .stores._records import Current, Marker


class PartitionView:
    def __init__(self, store: DedupStore, partition: str, current: Current | None = None) -> None:
        self._store, self._partition = store, partition
        self.markers: dict[DedupKey, Marker] = dict(current.markers) if current else {}
        self._read: dict[str, Stored] = dict(current.entities) if current else {}
        self._now: dict[str, dict[str, JSON] | None] = {name: s.data for name, s in self._read.items()}

    def read(self, name: str) -> Stored:
        """The entity as the messages before this one left it (one request when it was not read yet)."""
        if name not in self._read:
            if not self._store.commits_changes:
                raise TypeError(f"{type(self._store).__name__} cannot commit changes of stored entities")
            found = self._store.read_current(self._partition, (), (name,)).entities[name]
            self._read[name], self._now[name] = found, found.data
        return Stored(name, copy.deepcopy(self._now[name]), self._read[name].etag)

    def fold(self, changes: Sequence[Change]) -> tuple[Change, ...]:
        """This message's changes applied over what the messages before it left: the state of
        each entity it changes once it is applied, at the version read (the store chains the
        commits of one call). An entity left as absent as it was read is not written."""
        for change in changes:
            if change.name not in self._read:
                raise ValueError(f"{change.name}: a handler changes only what it read (context.read)")
        now = dict(self._now)
        for change in changes:
            before = now[change.name]
            data = change.data if change.data is None or not change.merge else {**(before or {}), **change.data}
            now[change.name] = None if data is None else dict(data)
        self._now = now
        names = dict.fromkeys(change.name for change in changes)
        return tuple(Change(name, now[name], self._read[name].etag) for name in names
                     if now[name] is not None or self._read[name].data is not None)  # fmt: skip
