"""The in-memory store passes the same contract as the real ones (for users' unit tests;
it proves nothing about Azure)."""

from __future__ import annotations

import pytest

from shared.idempotency.stores import DedupStore, MemoryStore
from shared.idempotency.testing import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> DedupStore:
        return MemoryStore()

    def unreachable_store(self) -> DedupStore:
        store = MemoryStore()
        store.available = False
        return store
