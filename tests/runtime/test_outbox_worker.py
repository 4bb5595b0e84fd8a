"""The outbox of an HTTP call through the real Functions worker (4.34.0, tools/runtime): an
order accepted by ``POST /api/orders`` with ORDER_ACCEPTED_TOPIC set publishes OrderAccepted
exactly once, with the same MessageId on every re-send — and when its first send fails, the
order is still accepted (201), its message parked and sent by the ``dispatch_outbox`` timer.
The sender writes what it sends to a file (DEDUP_SENDER=file); a missing folder fails a send.
Skips without the worker release, as tests/runtime/test_python_worker.py does."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.idempotency.keys import DedupKey
from shared.idempotency.outbox import message_id
from tests.runtime.test_python_worker import FUNCTION_KEY, an_order, app_settings, new_id
from tools.azurite import Azurite
from tools.runtime import build
from tools.runtime.host import WorkerHost
from tools.runtime.triggers import Http, http, http_result, timer


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[WorkerHost, Path]]:
    if build.configured() is None:
        pytest.skip(f"set {build.SOURCE_SETTING} to the worker release {build.RELEASE} archive, or run `make worker`")
    runtime = build.prepare(["orders_api"])  # the recipe ``http`` switched on
    with tempfile.TemporaryDirectory(prefix="runtime-http-outbox-") as folder, Azurite() as azurite:
        sent = Path(folder) / "out" / "sent.jsonl"
        settings = {**app_settings(azurite, "ho" + uuid.uuid4().hex[:12]), "ORDER_ACCEPTED_TOPIC": "order-events",
                    "DEDUP_SENDER": "file", "DEDUP_SENDER_FILE": str(sent),
                    "DEDUP_OUTBOX_SWEEP_DELAY": "PT0S"}  # the sweep may send at once  # fmt: skip
        with WorkerHost(runtime, settings) as host:
            yield host.start_app(), sent


def post(worker: WorkerHost, order_id: str, key: str) -> int:
    headers = {"Content-Type": "application/json", "x-functions-key": FUNCTION_KEY, "Idempotency-Key": key}
    response = worker.invoke("orders_api", http(worker.trigger("orders_api"), Http("POST", "/api/orders", headers,
                                                                                   an_order(order_id))))  # fmt: skip
    assert worker.failed(response) is None
    return http_result(worker.pb, response)[0]


def published(sent: Path, order_id: str) -> list[str]:
    lines = [json.loads(line) for line in sent.read_text().splitlines()] if sent.exists() else []
    return [line["messageId"] for line in lines if line["body"]["orderId"] == order_id]


def sweep(worker: WorkerHost) -> None:
    assert worker.failed(worker.invoke("dispatch_outbox", timer(worker.trigger("dispatch_outbox")))) is None


def test_an_order_accepted_over_http_publishes_order_accepted_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    order_id, key = new_id(), uuid.uuid4().hex
    assert [post(worker, order_id, k) for k in (key, key, uuid.uuid4().hex)] == [201, 201, 201]  # retries replay
    sweep(worker)
    assert published(sent, order_id) == [message_id(DedupKey("orders-api", order_id), "accepted")]


def test_an_order_whose_first_send_fails_is_accepted_and_its_message_swept_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    order_id, key = new_id(), uuid.uuid4().hex
    sent.parent.rename(sent.parent.with_name("away"))  # every send fails now
    try:
        assert post(worker, order_id, key) == 201  # committed and parked: the order is accepted
        assert post(worker, order_id, key) == 201  # a retry replays; its send fails too
        sweep(worker)  # the sweep's send fails as well: the key waits for the next one
    finally:
        sent.parent.with_name("away").rename(sent.parent)
    assert published(sent, order_id) == []
    deadline = time.monotonic() + 30  # a key whose sweep failed is due again a second later
    while not published(sent, order_id) and time.monotonic() < deadline:
        sweep(worker)
    sweep(worker)  # nothing left: never sent twice
    assert published(sent, order_id) == [message_id(DedupKey("orders-api", order_id), "accepted")]
