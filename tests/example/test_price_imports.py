"""The ``blob-import`` recipe (recipes/prices.py) on the real Azurite blob, queue and table
services, its files delivered as the Functions host's blob trigger with the Event Grid source
delivers them (lab/blob_host.py: BlobCreated events, the host's blob-trigger queue, its poison
queue): a duplicate event, a re-upload, a corrected file, a crash mid-file, a file too large
or malformed, an invalid record, a record that keeps failing, two contents at once; exact
counts of what is applied and of the store's requests each time."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

import recipes
from lab.blob_host import BlobHost
from lab.blob_import_run import applied_prices, per_sku, price_lines
from lab.host import user_function
from lab.infra_checks import ROOT
from shared.idempotency import Delivery, Effects, InvalidMessage, Outcome, Outgoing, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.imports import FileImport
from shared.idempotency.keys import consumer_partition
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import wrapped_handler
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash
from tests.functions import app_settings, fresh_app, store_down

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


def current(host: BlobHost, name: str = FILE) -> dict[str, float]:
    """Each SKU's price as its latest applied version has it (FileImport.current)."""
    found = prices.prices_import().current(f"{host.container}/{name}", "price")
    return {sku: float(price["price"]) for sku, price in found.items()}


def test_a_duplicate_event_and_a_reupload_of_the_same_content_cost_one_read_each(
    host: BlobHost, requests: list[str]
) -> None:
    content = price_lines(120)
    event = upload(host, content)
    deliver(host, event)
    first = len(requests)
    # the file's row read, the applied rows read; the file's row marked in progress (upsert_if_newer:
    # its state read, then written); 120 records x 4 operations (guard, marker, the applied row, the
    # price) = 5 transactions; the file's row read and replaced, done; the expiry notes wait in memory
    assert requests == ["GET", "GET", "GET", "POST", *["POST"] * 5, "GET", "PUT"], requests
    deliver(host, event)  # Event Grid delivered it twice
    deliver(host, upload(host, content))  # the same file uploaded again: a new ETag, a new event
    assert requests[first:] == ["GET", "GET"]
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(120)})
    assert (host.listener.tally.invocations, host.reads, host.poisoned()) == (3, 3, [])


def test_a_corrected_file_applies_only_what_it_changed_and_a_revert_applies_again(
    host: BlobHost, requests: list[str]
) -> None:
    first = price_lines(100)
    deliver(host, upload(host, first))
    corrected = price_lines(102, changed={3: 9.99, 50: 0.5}, removed={70})  # two changed, one gone, two new
    before = len(requests)
    deliver(host, upload(host, corrected))
    # the file's row and the applied rows read; the file's row in progress; 4 records in one
    # transaction; the 2 rows they supersede deleted in one; the file's row read and replaced, done
    assert requests[before:] == ["GET", "GET", "GET", "PUT", "POST", "POST", "GET", "PUT"], requests[before:]
    twice = Counter({"s-3": 2, "s-50": 2})
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(102)}) + (
        twice - Counter({"s-3": 1, "s-50": 1})
    )
    assert current(host)["s-3"] == 9.99 and current(host)["s-70"] == 7.0  # a line gone: left as it was
    deliver(host, upload(host, first))  # back to the first content: s-3 and s-50 change again
    applied = per_sku(applied_prices(shared_store(), partition(host)))
    assert sum(applied.values()) == 100 + 4 + 2 and applied["s-3"] == applied["s-50"] == 3
    assert current(host) == {**{f"s-{i}": i / 10 for i in range(100)}, "s-100": 10.0, "s-101": 10.1}
    # one row per key left: the superseded ones deleted as each run ended
    assert len(prices.prices_import().applied(partition(host))) == 102


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
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(120)})
    # the first run: 2 reads, the row in progress (a read, a write), 4 transactions (80 records); the
    # second: 2 reads, the row's state read (in progress already), 2 transactions, the row done
    assert len(requests) == (2 + 2 + 4) + (2 + 1 + 2 + 2), requests


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
        assert len(shared_store().dead_letters("prices")) == 1  # the duplicate event: recognised, one read
        with app_settings(DEDUP_IMPORT_MAX_BYTES="4000"):
            deliver(host, event)  # the limit raised: the same file, imported
            found = applied_prices(shared_store(), consumer_partition("prices", f"imports-large/{FILE}"))
        assert sum(found.values()) == 40


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
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(30)})


def test_an_older_uploads_late_run_never_overwrites_a_newer_one(host: BlobHost) -> None:
    """Versions order a file's uploads (a blob's Last-Modified): a run of an older content that
    read what was applied before a newer one committed applies below it (the latest still
    wins); one that reads the applied rows after skips every key as stale; one that starts
    after the newer one was imported whole does nothing (one read)."""
    consumer = prices.prices_import()
    file, older, newer = f"{host.container}/{FILE}", price_lines(20), price_lines(20, changed={5: 1.5})
    store, read = consumer.store, consumer.store.read_entities
    before = {prefix: read(partition(host), prefix, 2**62) for prefix in ("~file", "~import|")}
    assert consumer.run(file, newer, 200).done
    # The older run read the file's row and the applied rows before the newer run committed.
    store.read_entities = lambda partition, prefix, limit: before[prefix]  # type: ignore[method-assign]
    late = consumer.run(file, older, 100)
    del store.read_entities
    assert late.done and late.count(Outcome.PROCESSED) == 20  # applied, at version 100, below 200
    assert current(host)["s-5"] == 1.5
    store.read_entities = lambda partition, prefix, limit: (  # type: ignore[method-assign]
        before["~file"] if prefix == "~file" else read(partition, prefix, limit)
    )  # the applied rows read after it
    skipped = consumer.run(file, older, 100)
    del store.read_entities
    assert (skipped.stale, skipped.results) == (20, ())  # every key applied at a newer version: none applied
    assert consumer.run(file, older, 100).newer  # starting now: the file's row says 200
    assert current(host)["s-5"] == 1.5 and shared_store().dead_letters("prices") == []


def test_two_uploads_within_one_version_with_other_content_are_a_recorded_conflict(host: BlobHost) -> None:
    """Last-Modified has whole seconds: two uploads in one second share a version. The second
    content's changed records meet the first's markers with other data: dead-lettered
    (fingerprint_mismatch) and acknowledged, as every conflict; the first content stays."""
    consumer = prices.prices_import()
    file = f"{host.container}/{FILE}"
    assert consumer.run(file, price_lines(20), 300).done
    second = consumer.run(file, price_lines(20, changed={5: 1.5}), 300)
    assert second.done and second.count(Outcome.CONFLICT) == 1 and second.unchanged == 19
    [record] = shared_store().dead_letters("prices")
    assert record.reason == "fingerprint_mismatch" and json.loads(record.key_id or "")[1] == "s-5"
    assert current(host)["s-5"] == 0.5


def test_refused_records_are_tried_again_when_the_same_content_comes_again(host: BlobHost) -> None:
    """A file whose records were refused is not recognised whole: once the handler (or schema)
    is fixed, the same bytes uploaded again apply what was refused, and nothing else."""

    def refuses_s7(handler: Any) -> Any:
        def handle(record: Any, context: Any) -> Any:
            if record["sku"] == "s-7":
                raise InvalidMessage("not_yet", "refused until the fix")
            return handler(record, context)

        return handle

    with wrapped_handler(prices.prices_import(), refuses_s7):
        deliver(host, upload(host, price_lines(30)))
    assert [d.reason for d in shared_store().dead_letters("prices")] == ["not_yet"]
    deliver(host, upload(host, price_lines(30)))  # fixed: the same bytes again
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(30)})
    deliver(host, upload(host, price_lines(30)))  # now imported whole: recognised
    assert host.listener.tally.invocations == 3 and len(shared_store().dead_letters("prices")) == 1


def test_a_byte_order_mark_and_crlf_line_ends_import_as_any_file(host: BlobHost) -> None:
    deliver(host, upload(host, b"\xef\xbb\xbf" + price_lines(5).replace(b"\n", b"\r\n")))
    assert per_sku(applied_prices(shared_store(), partition(host))) == Counter({f"s-{i}": 1 for i in range(5)})


def test_a_handler_that_sends_messages_is_refused_per_record_not_retried(host: BlobHost) -> None:
    """An import has no outbox: a handler's outgoing messages refuse its record (handler_result)."""
    sending = FileImport("sending", shared_store(), lambda record, context: Effects(
        [], messages=[Outgoing("somewhere", record)]), key_field="sku")  # fmt: skip
    run = sending.run(f"{host.container}/{FILE}", price_lines(3), 1)
    assert run.done and run.count(Outcome.INVALID) == 3
    assert sorted(d.reason for d in shared_store().dead_letters("sending")) == ["handler_result"] * 3


def test_a_run_stops_at_its_deadline_and_after_a_chunk_that_still_fails_and_the_next_one_resumes(
    host: BlobHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shared.idempotency.imports.CHUNK", 10)
    consumer, file, content = prices.prices_import(), f"{host.container}/{FILE}", price_lines(30)
    late = consumer.run(file, content, 1, deadline=time.monotonic())  # no time left: nothing started
    assert (late.done, late.pending, late.results) == (False, 30, ())
    with store_down(consumer):  # the first chunk waits (DEDUP_TRANSIENT_WAIT: none here) and fails: no other
        failing = consumer.run(file, content, 1)
    assert (failing.done, failing.pending, failing.count(Outcome.TRANSIENT)) == (False, 20, 10)
    resumed = consumer.run(file, content, 1)
    assert resumed.done and resumed.count(Outcome.PROCESSED) == 30


def test_content_imported_whole_before_is_not_recognised_over_a_newer_uploads_half_applied_records(
    host: BlobHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X imported whole; Y, a newer upload, dies after its first chunk; X uploaded again: its
    run finds the file's row in progress, not X's, and puts back what Y had changed."""
    monkeypatch.setattr("shared.idempotency.imports.CHUNK", 10)
    consumer, file = prices.prices_import(), f"{host.container}/{FILE}"
    x, y = price_lines(30), price_lines(30, changed={i: 100.0 + i for i in range(30)})
    assert consumer.run(file, x, 1).done
    process_batch = consumer.process_batch

    def dies_after_the_first(deliveries: Sequence[Delivery]) -> list[Result]:
        process_batch(deliveries)
        raise Crash("after the first chunk")

    consumer.process_batch = dies_after_the_first  # type: ignore[method-assign]
    with pytest.raises(Crash):
        consumer.run(file, y, 2)
    del consumer.process_batch
    again = consumer.run(file, x, 3)
    assert (again.recognised, again.count(Outcome.PROCESSED), again.unchanged) == (False, 10, 20)
    assert current(host) == {f"s-{i}": i / 10 for i in range(30)}
    assert consumer.run(file, x, 3).recognised  # done now
