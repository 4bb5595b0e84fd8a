"""A Storage queue message as a Delivery: the service's id and dequeue count, and the last
dequeue told by the host's maxDequeueCount (the app setting over host.json, else host.json,
else the host's default of 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.functions.queue import QueueMessage

from shared.idempotency.functions import _host, _storage_queue
from shared.idempotency.functions.adapters import storage_queue_delivery

OVERRIDE = "AzureFunctionsJobHost__extensions__queues__maxDequeueCount"  # an app setting over host.json


@pytest.fixture
def host_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A host.json of the test's own, read afresh."""
    path = tmp_path / "host.json"
    monkeypatch.setattr(_host, "HOST_JSON", path)
    monkeypatch.delenv(OVERRIDE, raising=False)
    _host.host_setting.cache_clear()
    yield path
    _host.host_setting.cache_clear()


def message(dequeue_count: int) -> QueueMessage:
    return QueueMessage(id="m-1", body=b'{"returnId": "r-1"}', dequeue_count=dequeue_count)  # type: ignore[no-untyped-call]


def test_the_limit_is_host_jsons_then_the_app_settings_override(
    host_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _storage_queue.max_dequeue_count() == 5  # no host.json: the host's default
    host_json.write_text(json.dumps({"version": "2.0", "extensions": {"queues": {"maxDequeueCount": 3}}}))
    _host.host_setting.cache_clear()
    assert _storage_queue.max_dequeue_count() == 3
    monkeypatch.setenv(OVERRIDE, "7")
    _host.host_setting.cache_clear()
    assert _storage_queue.max_dequeue_count() == 7


def test_the_delivery_carries_the_services_id_and_dequeue_count(host_json: Path) -> None:
    delivery = storage_queue_delivery(message(2))
    assert (delivery.body, delivery.message_id, delivery.delivery_count) == (b'{"returnId": "r-1"}', "m-1", 2)


def test_only_the_last_dequeue_and_later_are_last_whatever_the_service_bus_limit(host_json: Path) -> None:
    host_json.write_text(json.dumps({"extensions": {"queues": {"maxDequeueCount": 3}}}))
    assert [storage_queue_delivery(message(n)).is_last(10) for n in (1, 2, 3, 4)] == [False, False, True, True]
