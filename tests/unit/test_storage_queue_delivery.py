"""A Storage queue message as a Delivery: the service's id and dequeue count, and the last
dequeue told by host.json's maxDequeueCount (the host's default, 5, when it sets none)."""

from __future__ import annotations

import json
from pathlib import Path

from azure.functions.queue import QueueMessage

from shared.idempotency.functions._storage_queue import MAX_DEQUEUE_COUNT, max_dequeue_count
from shared.idempotency.functions.adapters import storage_queue_delivery

ROOT = Path(__file__).resolve().parents[2]


def message(dequeue_count: int) -> QueueMessage:
    return QueueMessage(id="m-1", body=b'{"returnId": "r-1"}', dequeue_count=dequeue_count)  # type: ignore[no-untyped-call]


def test_the_limit_is_host_jsons_max_dequeue_count() -> None:
    queues = json.loads((ROOT / "host.json").read_text()).get("extensions", {}).get("queues", {})
    assert max_dequeue_count() == queues.get("maxDequeueCount", MAX_DEQUEUE_COUNT)


def test_the_delivery_carries_the_services_id_and_dequeue_count() -> None:
    delivery = storage_queue_delivery(message(2))
    assert (delivery.body, delivery.message_id, delivery.delivery_count) == (b'{"returnId": "r-1"}', "m-1", 2)


def test_only_the_last_dequeue_is_last_whatever_the_service_bus_limit() -> None:
    last = max_dequeue_count()
    assert storage_queue_delivery(message(last)).is_last(10)  # DEDUP_MAX_DELIVERY_COUNT does not apply
    assert not storage_queue_delivery(message(last - 1)).is_last(2)
