"""The keys an instance saw completed: a hot duplicate costs no store request."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .keys import DedupKey


class CompletedKeys:
    """A bounded, thread-safe LRU of (key → fingerprint) this instance saw completed. A
    completed marker never goes back, so a hit with the same fingerprint is a duplicate
    without asking the store; a miss proves nothing and goes to the store."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[DedupKey, str] = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key: DedupKey) -> str | None:
        if self._size <= 0:
            return None
        with self._mutex:
            fp = self._keys.get(key)
            if fp is not None:
                self._keys.move_to_end(key)
            return fp

    def put(self, key: DedupKey, fp: str) -> None:
        if self._size <= 0:
            return
        with self._mutex:
            self._keys[key] = fp
            self._keys.move_to_end(key)
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)
