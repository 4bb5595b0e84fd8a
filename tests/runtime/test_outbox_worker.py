"""The outbox of an HTTP call through the real Functions worker (4.34.0, lab/runtime): an
item accepted by the library tests' ``POST /api/items`` (tests/app.py) with ITEMS_TOPIC set
publishes ItemRecorded exactly once, with the same MessageId on every re-send — and when its
first send fails, the item is still accepted (201), its message parked and sent by the
``dispatch_outbox`` timer. The sender writes what it sends to a file (DEDUP_SENDER=file); a
missing folder fails a send. Skips without the worker release, as
tests/runtime/test_python_worker.py does."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.runtime import build
from lab.runtime.host import WorkerHost
from lab.runtime.triggers import Http, http, http_result, timer
from shared.idempotency.keys import DedupKey
from shared.idempotency.outbox import message_id
from shared.idempotency.testing.azurite import Azurite
from tests.runtime.test_python_worker import FUNCTION_KEY, an_item, app_settings, new_id


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[WorkerHost, Path]]:
    if build.configured() is None:
        pytest.skip(f"set {build.SOURCE_SETTING} to the worker release {build.RELEASE} archive, or run `make worker`")
    runtime = build.prepare(with_tests=True)  # the library tests' consumers beside the app's
    with tempfile.TemporaryDirectory(prefix="runtime-http-outbox-") as folder, Azurite() as azurite:
        sent = Path(folder) / "out" / "sent.jsonl"
        settings = {**app_settings(azurite, "ho" + uuid.uuid4().hex[:12]), "ITEMS_TOPIC": "items",
                    "DEDUP_SENDER": "file", "DEDUP_SENDER_FILE": str(sent),
                    "DEDUP_OUTBOX_SWEEP_DELAY": "PT0S"}  # the sweep may send at once  # fmt: skip
        with WorkerHost(runtime, settings) as host:
            yield host.start_app(), sent


def post(worker: WorkerHost, item_id: str, key: str) -> int:
    headers = {"Content-Type": "application/json", "x-functions-key": FUNCTION_KEY, "Idempotency-Key": key}
    response = worker.invoke("items_api", http(worker.trigger("items_api"), Http("POST", "/api/items", headers,
                                                                                 an_item(item_id))))  # fmt: skip
    assert worker.failed(response) is None
    return http_result(worker.pb, response)[0]


def published(sent: Path, item_id: str) -> list[str]:
    lines = [json.loads(line) for line in sent.read_text().splitlines()] if sent.exists() else []
    return [line["messageId"] for line in lines if line["body"]["id"] == item_id]


def sweep(worker: WorkerHost) -> None:
    assert worker.failed(worker.invoke("dispatch_outbox", timer(worker.trigger("dispatch_outbox")))) is None


def test_an_item_accepted_over_http_publishes_item_recorded_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    item_id, key = new_id(), uuid.uuid4().hex
    assert [post(worker, item_id, k) for k in (key, key, uuid.uuid4().hex)] == [201, 201, 201]  # retries replay
    sweep(worker)
    assert published(sent, item_id) == [message_id(DedupKey("items-api", item_id), "published")]


def test_an_item_whose_first_send_fails_is_accepted_and_its_message_swept_once(app: tuple[WorkerHost, Path]) -> None:
    worker, sent = app
    sent.parent.mkdir(exist_ok=True)
    item_id, key = new_id(), uuid.uuid4().hex
    sent.parent.rename(sent.parent.with_name("away"))  # every send fails now
    try:
        assert post(worker, item_id, key) == 201  # committed and parked: the item is accepted
        assert post(worker, item_id, key) == 201  # a retry replays; its send fails too
        sweep(worker)  # the sweep's send fails as well: the key waits for the next one
    finally:
        sent.parent.with_name("away").rename(sent.parent)
    assert published(sent, item_id) == []
    deadline = time.monotonic() + 30  # a key whose sweep failed is due again a second later
    while not published(sent, item_id) and time.monotonic() < deadline:
        sweep(worker)
    sweep(worker)  # nothing left: never sent twice
    assert published(sent, item_id) == [message_id(DedupKey("items-api", item_id), "published")]
