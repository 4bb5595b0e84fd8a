"""Event Hubs in process, on Azurite: the trigger checkpoints a batch whether or not the
function succeeded, so a transient failure is raised only while the retry policy has retries
left; on the last try the event is parked with its reason, the batch returns, and the replay
tool applies it once the failure cleared — nothing lost, nothing twice. On the library tests'
stream (tests/app.py: ``item_stream``, consumer ``item-stream``)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest
from azure.functions import meta

from shared.idempotency import Context, DownstreamUnavailable, Effects
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions import RetryLater, on_eventhub_batch, shared_store
from shared.idempotency.replay import main as replay
from shared.idempotency.stores import DedupStore
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite
from tests import app
from tests.app import item, stream_consumer
from tests.functions import fresh_app
from tests.integration.operators import run_tool


def tracked(store: DedupStore) -> Counter[str]:
    """How many tracking records each event key has (the stream's ground truth)."""
    return Counter(str(stored.data["eventKey"]) for stored in store.scan()
                   if str(stored.entity).startswith("tracking|"))  # fmt: skip


def batch(*events: tuple[dict[str, Any], int, str | None]) -> list[func.EventHubEvent]:
    """As the Python library decodes the host's batch: one metadata shared by the events."""
    metadata = {
        "PartitionContext": meta.Datum(json.dumps({"EventHubName": "items", "PartitionId": "3"}), "json"),
        "PropertiesArray": meta.Datum(json.dumps([{"message_id": own} if own else {} for _, _, own in events]), "json"),
    }
    return [func.EventHubEvent(body=json.dumps(body).encode(), trigger_metadata=metadata, sequence_number=seq)
            for body, seq, _ in events]  # fmt: skip


def retry(count: int, most: int = 5) -> Any:
    return SimpleNamespace(retry_context=SimpleNamespace(retry_count=count, max_retry_count=most))


def test_a_failing_event_is_retried_then_parked_then_replayed_once(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    down = {"i-2"}
    handler = app.stream_handler

    def flaky(event: dict[str, Any], context: Context) -> Effects:
        if event["id"] in down:
            raise DownstreamUnavailable("the carrier's API is down")
        return handler(event, context)

    monkeypatch.setattr(app, "stream_handler", flaky)
    events = batch((item("i-1"), 40, "e-1"), (item("i-2"), 41, None), (item("i-3"), 42, "e-3"))
    with fresh_app(azurite):
        consumer = stream_consumer()
        with pytest.raises(RetryLater):  # retries left: the checkpoint waits
            on_eventhub_batch(stream_consumer, events, retry(0))
        on_eventhub_batch(stream_consumer, events, retry(5))  # the last try: parked, returns
        assert tracked(consumer.store) == {"e-1": 1, "e-3": 1}
        [record] = [d for d in consumer.store.dead_letters("item-stream")]
        assert (record.reason, record.message_id) == ("parked", "items/3/41")
        assert record.detail.startswith("downstream_unavailable")
        assert replay(["--consumer", "item-stream", "--consumers", "tests.app"]) == 1  # still down
        down.clear()
        assert replay(["--consumer", "item-stream", "--consumers", "tests.app"]) == 0
        assert replay(["--consumer", "item-stream", "--consumers", "tests.app"]) == 0  # again: a duplicate
        assert tracked(consumer.store) == {"e-1": 1, "items/3/41": 1, "e-3": 1}
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in out if line.startswith("{")] == [
        {"parked": 1, "transient": 1}, {"parked": 1, "processed": 1}, {"parked": 1, "duplicate": 1}]  # fmt: skip


def test_a_batch_of_100_events_commits_in_about_4_requests(azurite: Azurite) -> None:
    """The batch path: the events' records fall in 4 buckets (tests/app.py's ``bucket``), so
    a batch commits in a few entity-group transactions — 0.04 requests per event."""
    from azure.data.tables import TableServiceClient

    from shared.idempotency import DedupConfig, Delivery, IdempotentConsumer
    from shared.idempotency.stores import TableStore
    from shared.idempotency.stores._table_batch import TableTransactions
    from tests.app import SCHEMA, bucket, stream_handler

    sent: list[object] = []
    service = TableServiceClient.from_connection_string(azurite.connection_string, raw_request_hook=sent.append)
    lean = TableTransactions.of(service, "eventbatch", raw_request_hook=sent.append)
    store = TableStore(service, "eventbatch", "eventbatchdl", transactions=lean)
    store.create_tables()
    consumer = IdempotentConsumer("item-stream", store, stream_handler, schema=SCHEMA, partition_for=bucket,
                                  config=DedupConfig())  # fmt: skip
    events = [Delivery(json.dumps(item(f"i-{i}")).encode(), message_id=f"ev-{i}") for i in range(100)]
    sent.clear()
    assert {r.outcome.value for r in consumer.process_batch(events)} == {"processed"}
    assert len(sent) <= 5 and len(tracked(store)) == 100


def test_a_producer_id_is_read_where_the_sdks_and_cloudevents_put_it() -> None:
    """EventData.message_id arrives among the system properties as message-id; CloudEvents
    over AMQP with the cloudEvents_ prefix the binding prefers, or cloudEvents:."""
    from shared.idempotency.functions.adapters import eventhub_deliveries

    metadata = {
        "PartitionContext": meta.Datum(json.dumps({"EventHubName": "items", "PartitionId": "1"}), "json"),
        "PropertiesArray": meta.Datum(json.dumps([{}, {"cloudEvents_id": "e-9", "cloudEvents_source": "/s"},
                                                  {"cloudEvents:id": "e-9", "cloudEvents:source": "/s"}, {}]), "json"),
        "SystemPropertiesArray": meta.Datum(json.dumps([{"message-id": "sdk-1"}, {}, {}, {}]), "json"),
    }  # fmt: skip
    events = [func.EventHubEvent(body=b"{}", trigger_metadata=metadata, sequence_number=n) for n in range(4)]
    keys = [d.message_id for d in eventhub_deliveries(events)]
    assert keys[0] == "sdk-1" and keys[1] == keys[2] != "items/1/1" and keys[3] == "items/1/3"


def test_events_of_a_re_created_hub_are_new_though_their_sequence_numbers_repeat(azurite: Azurite) -> None:
    """Without a producer id the key is the event's place in its hub: hub, partition, sequence
    number and enqueued time. A replay from a checkpoint keeps all four (a duplicate); a hub
    re-created under the same name (or a geo-DR failover) starts its sequence numbers at 0 again,
    with later enqueued times: new events, applied — never refused as conflicts, never dropped."""
    metadata = {"PartitionContext": meta.Datum(json.dumps({"EventHubName": "items", "PartitionId": "0"}), "json")}

    def hub(start: datetime, amount: float) -> list[func.EventHubEvent]:
        return [func.EventHubEvent(body=json.dumps(item(f"i-{n}", amount)).encode(), trigger_metadata=metadata,
                                   sequence_number=n, enqueued_time=start + timedelta(seconds=n))
                for n in range(5)]  # fmt: skip

    before = datetime(2026, 11, 20, 8, 0, 0, 123000, tzinfo=UTC)
    with fresh_app(azurite):
        consumer = stream_consumer()
        for events in (hub(before, 1.0), hub(before, 1.0), hub(before + timedelta(days=10), 2.0)):
            on_eventhub_batch(stream_consumer, events, retry(0))  # the second: a replay
        found = tracked(consumer.store)
        assert (len(found), set(found.values())) == (10, {1})  # 5 events, then 5 new ones: each once
        assert "items/0/3@2026-11-20T08:00:03.123000Z" in found
        assert consumer.store.dead_letters("item-stream") == []


def test_every_failing_event_is_parked_on_the_last_try_even_when_one_cannot_be(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(event: dict[str, Any], context: Context) -> Effects:
        raise DownstreamUnavailable("down")

    monkeypatch.setattr(app, "stream_handler", failing)
    events = batch((item("i-1"), 1, "e-1"), (item("i-2"), 2, "e-2"))
    with fresh_app(azurite):
        consumer = stream_consumer()
        record = consumer.store.dead_letter

        def first_fails(letter: Any) -> None:
            if letter.message_id == "e-1":
                raise RuntimeError("the store refused this one")
            record(letter)

        monkeypatch.setattr(consumer.store, "dead_letter", first_fails)
        with pytest.raises(RetryLater):  # one could not be recorded: the invocation fails loudly
            on_eventhub_batch(stream_consumer, events, retry(5))
        assert [d.message_id for d in consumer.store.dead_letters("item-stream")] == ["e-2"]  # the other one is


def test_a_park_the_store_refuses_for_a_moment_is_tried_again_within_the_wait(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The last try's park meets a store that blinks (two refusals past azure-core's retries):
    it is tried again within DEDUP_TRANSIENT_WAIT, recorded once, and the batch returns; an
    event parked only when the store answered at once was lost when the checkpoint moved on."""

    def failing(event: dict[str, Any], context: Context) -> Effects:
        raise DownstreamUnavailable("down")

    monkeypatch.setattr(app, "stream_handler", failing)
    events = batch((item("i-1"), 1, "e-1"), (item("i-2"), 2, "e-2"))
    with fresh_app(azurite, DEDUP_TRANSIENT_WAIT="PT5S"):
        consumer = stream_consumer()
        record, refusals = consumer.store.dead_letter, Counter[str]()

        def blinks(letter: Any) -> None:
            if letter.message_id == "e-1" and refusals["e-1"] < 2:
                refusals["e-1"] += 1
                raise StoreUnavailable("503 after azure-core's retries")
            record(letter)

        monkeypatch.setattr(consumer.store, "dead_letter", blinks)
        with caplog.at_level(logging.INFO, logger="idempotency"):
            on_eventhub_batch(stream_consumer, events, retry(5))  # the last try: parked, returns
        parked = sorted(d.message_id or "" for d in consumer.store.dead_letters("item-stream"))
        assert (parked, refusals["e-1"]) == (["e-1", "e-2"], 2)
        logged = [(f["outcome"], f["message_id"]) for f in map(fields_of, caplog.records)
                  if f.get("outcome") == "parked" or f.get("reason") == "dead_letter_failed"]  # fmt: skip
        assert sorted(logged) == [("parked", "e-1"), ("parked", "e-2")]  # once each: its final outcome


def test_the_replay_tool_finds_its_consumer_when_another_cannot_be_built(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """items needs a sender once ITEMS_TOPIC is set; without a Service Bus setting it cannot be
    built here — the tool for item-stream, declared after it, must not care (found by make chaos)."""
    with fresh_app(azurite, ITEMS_TOPIC="items"):
        for name in ("ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace", "DEDUP_SENDER"):
            monkeypatch.delenv(name, raising=False)
        shared_store()  # the app's tables, as the app creates them (a command never does)
        found = run_tool("shared.idempotency.replay", "--consumer", "item-stream", "--consumers", "tests.app")
        assert (found.returncode, found.stdout.strip(), found.stderr) == (0, '{"parked": 0}', ""), found.stderr
        nobody = run_tool("shared.idempotency.replay", "--consumer", "nobody", "--consumers", "tests.app")
        assert nobody.returncode == 2 and "could not be built" in nobody.stderr, nobody.stderr
