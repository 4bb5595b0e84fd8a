"""The registry builds each consumer and the shared store once, even when a cold instance
receives many calls at the same moment, and again after a failed build or a reset."""

from __future__ import annotations

import threading

import pytest

from shared.idempotency.functions import shared_store
from shared.idempotency.functions._app import Once
from shared.idempotency.stores import MemoryStore
from shared.idempotency.testing import reset, using_store


def test_sixteen_concurrent_first_calls_build_once() -> None:
    builds: list[int] = []
    arrived = threading.Semaphore(0)

    def slow() -> int:
        builds.append(1)
        for _ in range(16):  # the build lasts until every thread has asked for the result
            assert arrived.acquire(timeout=10)
        return len(builds)

    once = Once(slow)
    seen: list[int] = []

    def call() -> None:
        arrived.release()
        seen.append(once())

    threads = [threading.Thread(target=call) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(builds), seen) == (1, [1] * 16)


def test_a_failed_build_is_tried_again_and_a_clear_rebuilds() -> None:
    attempts: list[int] = []

    def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("store unreachable on a cold start")
        return len(attempts)

    once = Once(flaky)
    with pytest.raises(ConnectionError):
        once()
    assert once() == once() == 2
    once.clear()
    assert once() == 3


def test_using_store_substitutes_the_shared_store_and_restores_it() -> None:
    store = MemoryStore()
    with using_store(store):
        assert shared_store() is store
    reset()
