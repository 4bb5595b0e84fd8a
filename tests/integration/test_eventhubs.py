"""Event Hubs in process, on Azurite: the trigger checkpoints a batch whether or not the
function succeeded, so a transient failure is raised only while the retry policy has retries
left; on the last try the event is parked with its reason, the batch returns, and the replay
tool applies it once the failure cleared — nothing lost, nothing twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest
from azure.functions import meta

import recipes
from shared.idempotency import Context, DownstreamUnavailable, Effects
from shared.idempotency.functions import RetryLater, on_eventhub_batch
from shared.idempotency.replay import main as replay
from shared.orders.checks import tracking_by_event
from shared.orders.tracking import tracking_handler
from tests.functions import fresh_app
from tests.integration.operators import run_tool
from tools.azurite import Azurite


def batch(*events: tuple[dict[str, Any], int, str | None]) -> list[func.EventHubEvent]:
    """As the Python library decodes the host's batch: one metadata shared by the events."""
    metadata = {
        "PartitionContext": meta.Datum(json.dumps({"EventHubName": "shipments", "PartitionId": "3"}), "json"),
        "PropertiesArray": meta.Datum(json.dumps([{"message_id": own} if own else {} for _, _, own in events]), "json"),
    }
    return [func.EventHubEvent(body=json.dumps(body).encode(), trigger_metadata=metadata, sequence_number=seq)
            for body, seq, _ in events]  # fmt: skip


def retry(count: int, most: int = 5) -> Any:
    return SimpleNamespace(retry_context=SimpleNamespace(retry_count=count, max_retry_count=most))


def test_a_failing_event_is_retried_then_parked_then_replayed_once(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shipments = recipes.module("shipments")

    down = {"s-2"}

    def flaky(event: dict[str, Any], context: Context) -> Effects:
        if event["shipmentId"] in down:
            raise DownstreamUnavailable("the carrier's API is down")
        return tracking_handler(event, context)

    monkeypatch.setattr(shipments, "tracking_handler", flaky)
    events = batch(({"shipmentId": "s-1", "orderId": "o", "status": "picked"}, 40, "e-1"),
                   ({"shipmentId": "s-2", "orderId": "o", "status": "picked"}, 41, None),
                   ({"shipmentId": "s-3", "orderId": "o", "status": "picked"}, 42, "e-3"))  # fmt: skip
    with fresh_app(azurite):
        consumer = shipments.tracking_consumer()
        with pytest.raises(RetryLater):  # retries left: the checkpoint waits
            on_eventhub_batch(shipments.tracking_consumer, events, retry(0))
        on_eventhub_batch(shipments.tracking_consumer, events, retry(5))  # the last try: parked, returns
        assert tracking_by_event(consumer.store) == {"e-1": 1, "e-3": 1}
        [record] = [d for d in consumer.store.dead_letters("shipments")]
        assert (record.reason, record.message_id) == ("parked", "shipments/3/41")
        assert record.detail.startswith("downstream_unavailable")
        assert replay(["--consumer", "shipments", "--consumers", shipments.__name__]) == 1  # still down
        down.clear()
        assert replay(["--consumer", "shipments", "--consumers", shipments.__name__]) == 0
        assert replay(["--consumer", "shipments", "--consumers", shipments.__name__]) == 0  # again: a duplicate
        assert tracking_by_event(consumer.store) == {"e-1": 1, "shipments/3/41": 1, "e-3": 1}
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in out if line.startswith("{")] == [
        {"parked": 1, "transient": 1}, {"parked": 1, "processed": 1}, {"parked": 1, "duplicate": 1}]  # fmt: skip


def test_a_batch_of_100_events_commits_in_about_4_requests(azurite: Azurite) -> None:
    """The batch path, as the ledger's postings use it: the events' records fall in 4 buckets,
    so a batch commits in a few entity-group transactions — 0.04 requests per event."""
    from azure.data.tables import TableServiceClient

    from shared.idempotency import DedupConfig, Delivery, IdempotentConsumer
    from shared.idempotency.stores import TableStore
    from shared.idempotency.stores._table_batch import TableTransactions
    from shared.orders.tracking import SCHEMA, bucket

    sent: list[object] = []
    service = TableServiceClient.from_connection_string(azurite.connection_string, raw_request_hook=sent.append)
    lean = TableTransactions.of(service, "eventbatch", raw_request_hook=sent.append)
    store = TableStore(service, "eventbatch", "eventbatchdl", transactions=lean)
    store.create_tables()
    consumer = IdempotentConsumer("shipments", store, tracking_handler, schema=SCHEMA, partition_for=bucket,
                                  config=DedupConfig())  # fmt: skip
    events = [Delivery(json.dumps({"shipmentId": f"s-{i}", "orderId": "o", "status": "picked"}).encode(),
                       message_id=f"ev-{i}") for i in range(100)]  # fmt: skip
    sent.clear()
    assert {r.outcome.value for r in consumer.process_batch(events)} == {"processed"}
    assert len(sent) <= 5 and len(tracking_by_event(store)) == 100


def test_a_producer_id_is_read_where_the_sdks_and_cloudevents_put_it() -> None:
    """EventData.message_id arrives among the system properties as message-id; CloudEvents
    over AMQP with the cloudEvents_ prefix the binding prefers, or cloudEvents:."""
    from shared.idempotency.functions.adapters import eventhub_deliveries

    metadata = {
        "PartitionContext": meta.Datum(json.dumps({"EventHubName": "shipments", "PartitionId": "1"}), "json"),
        "PropertiesArray": meta.Datum(json.dumps([{}, {"cloudEvents_id": "e-9", "cloudEvents_source": "/s"},
                                                  {"cloudEvents:id": "e-9", "cloudEvents:source": "/s"}, {}]), "json"),
        "SystemPropertiesArray": meta.Datum(json.dumps([{"message-id": "sdk-1"}, {}, {}, {}]), "json"),
    }  # fmt: skip
    events = [func.EventHubEvent(body=b"{}", trigger_metadata=metadata, sequence_number=n) for n in range(4)]
    keys = [d.message_id for d in eventhub_deliveries(events)]
    assert keys[0] == "sdk-1" and keys[1] == keys[2] != "shipments/1/1" and keys[3] == "shipments/1/3"


def test_events_of_a_re_created_hub_are_new_though_their_sequence_numbers_repeat(azurite: Azurite) -> None:
    """Without a producer id the key is the event's place in its hub: hub, partition, sequence
    number and enqueued time. A replay from a checkpoint keeps all four (a duplicate); a hub
    re-created under the same name (or a geo-DR failover) starts its sequence numbers at 0 again,
    with later enqueued times: new events, applied — never refused as conflicts, never dropped."""
    shipments = recipes.module("shipments")

    metadata = {"PartitionContext": meta.Datum(json.dumps({"EventHubName": "shipments", "PartitionId": "0"}), "json")}

    def hub(start: datetime, status: str) -> list[func.EventHubEvent]:
        return [func.EventHubEvent(body=json.dumps({"shipmentId": f"s-{n}", "orderId": "o", "status": status}).encode(),
                                   trigger_metadata=metadata, sequence_number=n,
                                   enqueued_time=start + timedelta(seconds=n)) for n in range(5)]  # fmt: skip

    before = datetime(2026, 11, 20, 8, 0, 0, 123000, tzinfo=UTC)
    with fresh_app(azurite):
        consumer = shipments.tracking_consumer()
        for events in (hub(before, "picked"), hub(before, "picked"), hub(before + timedelta(days=10), "shipped")):
            on_eventhub_batch(shipments.tracking_consumer, events, retry(0))  # the second: a replay
        tracked = tracking_by_event(consumer.store)
        assert (len(tracked), set(tracked.values())) == (10, {1})  # 5 events, then 5 new ones: each once
        assert "shipments/0/3@2026-11-20T08:00:03.123000Z" in tracked
        assert consumer.store.dead_letters("shipments") == []


def test_every_failing_event_is_parked_on_the_last_try_even_when_one_cannot_be(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipments = recipes.module("shipments")

    def failing(event: dict[str, Any], context: Context) -> Effects:
        raise DownstreamUnavailable("down")

    monkeypatch.setattr(shipments, "tracking_handler", failing)
    events = batch(({"shipmentId": "s-1", "orderId": "o", "status": "x"}, 1, "e-1"),
                   ({"shipmentId": "s-2", "orderId": "o", "status": "x"}, 2, "e-2"))  # fmt: skip
    with fresh_app(azurite):
        consumer = shipments.tracking_consumer()
        record = consumer.store.dead_letter

        def first_fails(letter: Any) -> None:
            if letter.message_id == "e-1":
                raise RuntimeError("the store refused this one")
            record(letter)

        monkeypatch.setattr(consumer.store, "dead_letter", first_fails)
        with pytest.raises(RetryLater):  # one could not be recorded: the invocation fails loudly
            on_eventhub_batch(shipments.tracking_consumer, events, retry(5))
        assert [d.message_id for d in consumer.store.dead_letters("shipments")] == ["e-2"]  # the other one is


def test_the_replay_tool_finds_its_consumer_when_another_cannot_be_built(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orders needs a sender once ORDER_ACCEPTED_TOPIC is set; without a Service Bus setting it
    cannot be built here — the tool for shipments (switched on) must not care (found by make chaos)."""
    with fresh_app(azurite, ORDER_ACCEPTED_TOPIC="order-events"):
        for name in ("ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace", "DEDUP_SENDER"):
            monkeypatch.delenv(name, raising=False)
        found = run_tool("shared.idempotency.replay", "--consumer", "shipments", switched_on=["shipments"])
        assert (found.returncode, found.stdout.strip(), found.stderr) == (0, '{"parked": 0}', ""), found.stderr
        nobody = run_tool("shared.idempotency.replay", "--consumer", "nobody", switched_on=["shipments"])
        assert nobody.returncode == 2 and "could not be built" in nobody.stderr, nobody.stderr
