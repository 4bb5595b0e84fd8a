"""What the handlers of one partition read in one attempt, and how their changes fold: each
handler sees the entities as the previous message of the attempt left them, and each commit
carries the state it leaves, conditioned on the version read — so that messages of one
partition (a batch) commit together, one write per entity, and a change made meanwhile by
anyone else refuses the lot (``CONTENDED``), which is then decided again from a fresh read."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from .errors import DedupError
from .keys import DedupKey
from .messages import JSON, Change, Stored
from .stores._base import DedupStore
from .stores._records import Current, Marker


class AlreadyDecided(DedupError):
    """The message's marker, read with the first entity its handler read, is final: the message
    was decided already (a copy, or this delivery's own commit whose answer was lost), so its
    handler stops there, rather than decide it again on the state that decision left. Raised
    through the handler: the consumer settles it (a handler must let it through)."""

    def __init__(self, marker: Marker) -> None:
        super().__init__("the message was decided already")
        self.marker = marker


class PartitionView:
    def __init__(self, store: DedupStore, partition: str, current: Current | None = None,
                 asked: Sequence[DedupKey] = ()) -> None:  # fmt: skip
        """``current``: what was read already, the markers of the keys ``asked`` among it."""
        self._store, self._partition = store, partition
        self.markers: dict[DedupKey, Marker] = dict(current.markers) if current else {}
        self._asked = set(asked)
        self._read: dict[str, Stored] = dict(current.entities) if current else {}
        self._now: dict[str, dict[str, JSON] | None] = {name: s.data for name, s in self._read.items()}

    def knows(self, key: DedupKey) -> bool:
        """Whether ``key``'s marker was read (found or not) with what this view read."""
        return key in self._asked or key in self.markers

    def read(self, name: str, key: DedupKey | None = None) -> Stored:
        """The entity as the messages before this one left it (one request when it was not read
        yet). ``key``: the message reading it, whose marker that request reads too, unless it was
        read already: when it is final, the message was decided (AlreadyDecided) before its
        handler could decide it again on a state it changed."""
        if name not in self._read:
            if not self._store.commits_changes:
                raise TypeError(f"{type(self._store).__name__} cannot commit changes of stored entities")
            keys = (key,) if key is not None and key not in self._asked else ()
            current = self._store.read_current(self._partition, keys, (name,))
            self._asked.update(keys)
            self.markers.update(current.markers)
            found = current.entities[name]
            self._read[name], self._now[name] = found, found.data
            if key is not None and (marker := current.markers.get(key)) is not None and marker.final:
                raise AlreadyDecided(marker)
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
