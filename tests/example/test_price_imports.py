"""The ``blob-import`` recipe (recipes/prices.py) on the real Azurite blob, queue and table
services, its files delivered as the Functions host's blob trigger with the Event Grid source
delivers them (lab/blob_host.py: BlobCreated events, the host's blob-trigger queue, its poison
queue): a duplicate event, a re-upload, a corrected file, a crash mid-file, a file too large
or malformed, an invalid record, a record that keeps failing, two contents at once; exact
counts of what is applied and of the store's requests each time."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

import recipes
from lab.azurite import Azurite
from lab.blob_host import BlobHost
from lab.blob_import_run import applied_prices, current_prices, price_lines
from lab.faults import Crash
from lab.host import user_function
from lab.infra_checks import ROOT
from shared.idempotency import Delivery, Outcome, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.keys import consumer_partition
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import wrapped_handler
from tests.functions import fresh_app

prices = recipes.module("prices")
POISON_THRESHOLD = json.loads((ROOT / "host.json").read_text())["extensions"]["blobs"]["poisonBlobThreshold"]
FILE = "prices/2026-12.jsonl"
CONTAINER = "imports"


@pytest.fixture(scope="module")
def blobs() -> Iterator[Azurite]:
    with Azurite(service="blob") as emulator:
        yield emulator


@pytest.fixture(scope="module")
def queues() -> Iterator[Azurite]:
    with Azurite(service="queue") as emulator:
        yield emulator


@pytest.fixture
def host(azurite: Azurite, blobs: Azurite, queues: Azurite) -> Iterator[BlobHost]:
    """The app on fresh tables, a fresh container and a fresh blob-trigger queue."""
    container = "imports-" + uuid.uuid4().hex[:8]
    with fresh_app(azurite, IMPORTS_CONTAINER=container, ImportsConnection=blobs.connection_string):
        shared_store().create_tables()
        yield BlobHost(blobs.connection_string, queues.connection_string, container, user_function("price_import"),
                       host_id=uuid.uuid4().hex[:8], poison_threshold=POISON_THRESHOLD,
                       lease=timedelta(seconds=1))  # fmt: skip


@pytest.fixture
def requests(azurite: Azurite, host: BlobHost) -> list[str]:
    """Every request the import's store sends from now on (its client's raw_request_hook)."""
    consumer = prices.prices_import()
    assert isinstance(consumer.store, TableStore)
    sent: list[str] = []
    service = TableServiceClient.from_connection_string(
        azurite.connection_string, raw_request_hook=lambda r: sent.append(r.http_request.method))  # fmt: skip
    consumer.store = TableStore(service, consumer.store.table.table_name, consumer.store.dead_letter_table)
    return sent


def upload(host: BlobHost, content: bytes, name: str = FILE) -> dict[str, Any]:
    return host.upload(name, content)


def deliver(host: BlobHost, *events: dict[str, Any]) -> None:
    assert host.notify(list(events)) == 202
    host.drain()


def partition(host: BlobHost, name: str = FILE) -> str:
    return consumer_partition("prices", f"{host.container}/{name}")


def test_a_duplicate_event_and_a_reupload_of_the_same_content_cost_one_read_each(
    host: BlobHost, requests: list[str]
) -> None:
    content = price_lines(120)
    event = upload(host, content)
    deliver(host, event)
    first = len(requests)
    # 120 records x 4 operations (guard, marker, the applied row, the price) = 5 transactions;
    # the file's row read, the applied rows read, the file's row written; expiry notes wait in memory
    assert requests == ["GET", "GET", *["POST"] * 5, "PUT"], requests
    deliver(host, event)  # Event Grid delivered it twice
    deliver(host, upload(host, content))  # the same file uploaded again: a new ETag, a new event
    assert requests[first:] == ["GET", "GET"]
    assert applied_prices(shared_store(), partition(host)) == Counter({(f"s-{i}", 1): 1 for i in range(120)})
    assert (host.listener.tally.invocations, host.reads, host.poisoned()) == (3, 3, [])


def test_a_corrected_file_applies_only_what_it_changed_and_a_revert_applies_again(host: BlobHost) -> None:
    first = price_lines(100)
    deliver(host, upload(host, first))
    corrected = price_lines(102, changed={3: 9.99, 50: 0.5}, removed={70})  # two changed, one gone, two new
    deliver(host, upload(host, corrected))
    store = shared_store()
    applied = applied_prices(store, partition(host))
    assert sum(applied.values()) == 100 + 4
    assert applied[("s-3", 2)] == applied[("s-50", 2)] == applied[("s-100", 1)] == applied[("s-101", 1)] == 1
    deliver(host, upload(host, first))  # back to the first content: s-3 and s-50 change again
    applied = applied_prices(store, partition(host))
    assert sum(applied.values()) == 100 + 4 + 2 and applied[("s-3", 3)] == applied[("s-50", 3)] == 1
    current = current_prices(store, partition(host))
    assert current["s-3"] == 0.3 and current["s-50"] == 5.0 and current["s-70"] == 7.0 and current["s-101"] == 10.1


def test_a_crash_mid_file_resumes_on_the_next_run_without_applying_anything_twice(
    host: BlobHost, requests: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed in chunks of 40; the process dies after the second chunk's commit. The host's
    queue message comes back when its lease lapses: the next run reads what was applied and
    applies the rest."""
    monkeypatch.setattr("shared.idempotency.imports.CHUNK", 40)
    consumer = prices.prices_import()
    process_batch = consumer.process_batch
    calls: list[int] = []

    def dies_after_the_second(deliveries: Sequence[Delivery]) -> list[Result]:
        answered = process_batch(deliveries)
        calls.append(len(deliveries))
        if len(calls) == 2:
            raise Crash("after the second chunk's commit")
        return answered

    consumer.process_batch = dies_after_the_second  # type: ignore[method-assign]
    deliver(host, upload(host, price_lines(120)))
    assert calls == [40, 40, 40]  # the third chunk is the next run's only one
    assert (host.listener.tally.crashes, host.listener.tally.invocations, host.listener.tally.deleted) == (1, 2, 1)
    assert applied_prices(shared_store(), partition(host)) == Counter({(f"s-{i}", 1): 1 for i in range(120)})
    assert len(requests) < 0.1 * 120


def test_a_file_too_large_is_refused_whole_with_a_record_and_its_duplicate_costs_one_read(
    azurite: Azurite, blobs: Azurite, queues: Azurite
) -> None:
    with fresh_app(azurite, IMPORTS_CONTAINER="imports-large", ImportsConnection=blobs.connection_string,
                   DEDUP_IMPORT_MAX_BYTES="1000"):  # fmt: skip
        shared_store().create_tables()
        host = BlobHost(blobs.connection_string, queues.connection_string, "imports-large",
                        user_function("price_import"), host_id=uuid.uuid4().hex[:8])  # fmt: skip
        event = host.upload(FILE, price_lines(40))
        deliver(host, event, event)
        [record] = shared_store().dead_letters("prices")
        assert (record.reason, record.key_id) == ("file_too_large", f"imports-large/{FILE}")
        assert "at most 1000" in record.detail and record.body == price_lines(40)
        assert applied_prices(shared_store(), consumer_partition("prices", f"imports-large/{FILE}")) == Counter()
        assert (host.listener.tally.invocations, host.listener.tally.deleted, host.poisoned()) == (2, 2, [])


@pytest.mark.parametrize(("content", "detail"), [
    (price_lines(60)[:-30], "line 60: invalid_json"),  # an upload cut short
    (price_lines(10) + b'{"sku": "s-3", "price": 1, "currency": "EUR"}\n', "line 11: key 's-3' is on line 4 too"),
    (price_lines(10) + b'{"price": 1, "currency": "EUR"}\n', "line 11: not a JSON object with its key 'sku'"),
    (b"[1, 2]\n", "line 1: not a JSON object"),
], ids=["cut-short", "a-key-twice", "no-key", "not-an-object"])  # fmt: skip
def test_a_malformed_file_is_refused_whole_with_the_line_and_nothing_applied(
    host: BlobHost, content: bytes, detail: str
) -> None:
    deliver(host, upload(host, content))
    [record] = shared_store().dead_letters("prices")
    assert record.reason == "file_malformed" and record.detail.startswith(detail), record.detail
    assert applied_prices(shared_store(), partition(host)) == Counter()
    assert (host.listener.tally.invocations, host.poisoned()) == (1, [])
    deliver(host, upload(host, price_lines(60)))  # the whole file, uploaded again: applied
    assert sum(applied_prices(shared_store(), partition(host)).values()) == 60


def test_an_invalid_record_is_refused_alone_at_the_first_run(host: BlobHost) -> None:
    content = price_lines(30).replace(b'"currency": "EUR"}', b'"currency": "euro"}', 1)
    deliver(host, upload(host, content))
    [record] = shared_store().dead_letters("prices")
    assert record.reason == "schema_violation" and json.loads(record.key_id or "")[1] == "s-0"
    assert sum(applied_prices(shared_store(), partition(host)).values()) == 29
    assert (host.listener.tally.invocations, host.poisoned()) == (1, [])


def test_a_record_that_keeps_failing_poisons_the_blob_and_a_later_run_finishes_the_file(host: BlobHost) -> None:
    def fails_on_s7(handler: Any) -> Any:
        def handle(record: Any, context: Any) -> Any:
            if record["sku"] == "s-7":
                raise RuntimeError("a bug")
            return handler(record, context)

        return handle

    consumer = prices.prices_import()
    with wrapped_handler(consumer, fails_on_s7):
        deliver(host, upload(host, price_lines(30)))
    assert host.listener.tally.invocations == POISON_THRESHOLD and host.listener.tally.poisoned == 1
    [poison] = host.poisoned()
    assert (poison["ContainerName"], poison["BlobName"]) == (host.container, FILE)
    assert sum(applied_prices(shared_store(), partition(host)).values()) == 29  # the others, once
    deliver(host, upload(host, price_lines(30)))  # fixed; the file uploaded again
    assert applied_prices(shared_store(), partition(host)) == Counter({(f"s-{i}", 1): 1 for i in range(30)})


def test_two_runs_of_different_contents_at_once_end_with_the_latest_applied(host: BlobHost) -> None:
    """A run reads what was applied, another run of a newer content commits first: the older
    run's changed records meet a conflict (no dead letter), and it fails, to be run again — on
    the blob as it is then, the newer content, which changes nothing."""
    consumer = prices.prices_import()
    file = f"{host.container}/{FILE}"
    before = consumer.applied(partition(host))
    consumer.run(file, price_lines(20, changed={5: 1.5}))  # the newer content, first to commit
    consumer.applied = lambda partition: before  # type: ignore[method-assign]  # the older run read before
    older = consumer.run(file, price_lines(20))
    assert not older.done and older.count(Outcome.CONFLICT) == 1 and older.count(Outcome.DUPLICATE) == 19
    assert shared_store().dead_letters("prices") == []
    del consumer.applied
    again = consumer.run(file, price_lines(20, changed={5: 1.5}))  # its retry reads the blob again
    assert again.done and again.recognised  # the content the newer run imported whole
    assert current_prices(shared_store(), partition(host))["s-5"] == 1.5
