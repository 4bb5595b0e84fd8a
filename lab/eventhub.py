"""Event Hubs under fire: a partitioned stream with the trigger's semantics, driving the real
`shipment_tracking` function in process, on Azurite, with faults. Then the real store is read.

What it models, as the Event Hubs trigger does it:
- a partition is read in batches from its checkpoint; the checkpoint moves past a batch
  **after the function returns, whether or not it succeeded** — the function's retry policy
  (here ``retries`` tries more, each told its retry count) is the only thing that holds it;
- a crash (the instance dies) leaves the checkpoint where it was: the next owner replays
  everything since it; a **rebalance** hands a partition to another instance, which starts
  at the checkpoint while the old owner may still be finishing its batch;
- a producer's retry is a new event (a new sequence number) with the producer's own id.

Counts: every event applied once, or parked with its reason and applied once by the replay
tool afterwards (reported apart); a batch that failed for good is events lost.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import azure.functions as func
from azure.functions import meta

import recipes
from lab.findings import Findings
from lab.harness import _attach_store, _counting_outcomes
from shared.idempotency.functions.adapters import event_position
from shared.idempotency.reasons import Reason
from shared.idempotency.stores import DedupStore, TableStore
from shared.idempotency.testing import reset
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash, FaultPlan

shipments = recipes.module("shipments")
tracking_handler = shipments.tracking_handler

HUB = "shipments"


def tracking_by_event(store: DedupStore) -> Counter[str]:
    """How many tracking records each event key has (the stream's ground truth)."""
    return Counter(str(item.data["eventKey"]) for item in store.scan()
                   if str(item.entity).startswith(shipments.TRACKING + "|"))  # fmt: skip


@dataclass(frozen=True)
class StreamConfig:
    events: int = 400
    partitions: int = 4
    instances: int = 3
    batch: int = 10
    retries: int = 3  # the function's retry policy: max_retry_count
    producer_retry_rate: float = 0.2  # a producer's retry: the same producer id, a new event
    with_ids: float = 0.7  # events carrying a producer id; the others are keyed hub/partition/sequence
    fault_rate: float = 0.05  # store requests
    failure_rate: float = 0.05  # events whose handler fails transiently, for this many tries:
    failure_tries: int = 6  # more than the retry policy has: some are parked, then replayed
    crash_rate: float = 0.05  # an instance dies after a batch, before its checkpoint
    rebalance_rate: float = 0.05  # a partition moves to another instance between batches
    seed: int = 1


@dataclass
class StreamReport(Findings):
    logical: int = 0
    sent: int = 0
    invocations: int = 0
    replays: int = 0  # batches read again from a checkpoint after a crash
    rebalances: int = 0  # partitions handed to another instance mid-stream
    parked: int = 0
    replayed_by_operator: int = 0
    lost: int = 0
    double: int = 0


@dataclass
class _Event:
    seq: int
    body: bytes
    own: str | None
    enqueued: datetime = field(default_factory=lambda: datetime.now(UTC))  # set by the service, kept by replays

    def as_delivered(self, metadata: dict[str, Any]) -> func.EventHubEvent:
        return func.EventHubEvent(body=self.body, trigger_metadata=metadata, sequence_number=self.seq,
                                  enqueued_time=self.enqueued)  # fmt: skip


class _Partition:
    def __init__(self) -> None:
        self.events: list[_Event] = []
        self.checkpoint = 0
        self.owner = 0
        self.lock = threading.Lock()


def run_stream(config: StreamConfig, azurite: Azurite) -> StreamReport:
    report, started, rng = StreamReport(), time.monotonic(), random.Random(config.seed)
    partitions = [_Partition() for _ in range(config.partitions)]
    logical: dict[str, str] = {}  # the key each logical event is applied under -> shipment id
    for i in range(config.events):
        own = f"ev-{i}" if rng.random() < config.with_ids else None
        body = json.dumps({"shipmentId": f"s-{i}", "orderId": f"o-{i % 50}", "status": "picked"}).encode()
        part = partitions[rng.randrange(config.partitions)]
        copies = 1 + (own is not None and rng.random() < config.producer_retry_rate)
        for _ in range(copies):
            part.events.append(_Event(len(part.events), body, own))
        last = part.events[-1].as_delivered({})
        logical[own or event_position(f"{HUB}/{partitions.index(part)}", last)] = f"s-{i}"
    report.logical, report.sent = len(logical), sum(len(p.events) for p in partitions)
    for index, part in enumerate(partitions):
        part.owner = index % config.instances
    failing = {f"s-{i}": config.failure_tries for i in range(config.events) if rng.random() < config.failure_rate}
    plan = FaultPlan(config.fault_rate, config.seed, 1.0)
    table = "stream" + uuid.uuid4().hex[:12]
    os.environ.update(DEDUP_STORAGE_CONNECTION=azurite.connection_string, DEDUP_TABLE=table,
                      DEDUP_DEADLETTER_TABLE=table + "dl", DEDUP_TRANSIENT_WAIT="PT0S")  # fmt: skip
    real_handler, mutex = tracking_handler, threading.Lock()

    def flaky(event: dict[str, Any], context: Any) -> Any:
        with mutex:
            left = failing.get(event["shipmentId"], 0)
            if left:
                failing[event["shipmentId"]] = left - 1
        if left:
            from shared.idempotency import DownstreamUnavailable

            raise DownstreamUnavailable("injected: the carrier's API is down")
        return real_handler(event, context)

    with ExitStack() as stack:
        setattr(shipments, "tracking_handler", flaky)  # noqa: B010 - the consumer is built with it below
        stack.callback(setattr, shipments, "tracking_handler", tracking_handler)
        reset()
        consumer = shipments.tracking_consumer()
        store = _attach_store(consumer, azurite, plan, True, TableStore)  # the checker's clean view
        stack.enter_context(_counting_outcomes(report.outcomes))
        threads = [threading.Thread(target=_instance, args=(n, config, partitions, report, plan, random.Random(
            config.seed * 31 + n))) for n in range(config.instances)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        applied = tracking_by_event(store)
        report.parked = sum(1 for d in store.dead_letters("shipments") if d.reason == Reason.PARKED)
        from shared.idempotency.replay import main as replay

        if report.parked:  # the carrier's API is back; an operator replays what was parked
            failing.clear()
            plan.rate = 0.0  # and the store is calm: the replay is an operator's, not the fault run's
            with contextlib.redirect_stdout(io.StringIO()):  # its line per record: the counts below say it
                replay(["--consumer", "shipments", "--consumers", shipments.__name__])
            report.replayed_by_operator = report.parked
            applied = tracking_by_event(store)
    report.faults = plan.injected
    for key in logical:
        times = applied.get(key, 0)
        if times == 0:
            report.lost += 1
            report.violations.append(f"lost: {key}")
        elif times > 1:
            report.double += times - 1
            report.violations.append(f"applied {times} times: {key}")
    del report.violations[50:]
    report.seconds = time.monotonic() - started
    return report


def _instance(number: int, config: StreamConfig, partitions: list[_Partition], report: StreamReport,
              plan: FaultPlan, rng: random.Random) -> None:  # fmt: skip
    """One host instance: takes the batches of the partitions it owns until all are read."""
    while True:
        busy = False
        for index, part in enumerate(partitions):
            with part.lock:
                if part.owner != number or part.checkpoint >= len(part.events):
                    continue
                start = part.checkpoint
                if rng.random() < config.rebalance_rate:  # the partition moves on: the new owner reads
                    part.owner = (number + 1) % config.instances  # from the checkpoint while we finish
                    report.rebalances += 1
            busy = True
            batch = part.events[start : start + config.batch]
            try:
                _invoke(index, batch, config, report, rng)
            except Crash:
                report.replays += 1  # died before the checkpoint: the batch comes again
                continue
            with part.lock:
                if rng.random() < config.crash_rate:  # died after the function, before the checkpoint
                    plan.injected["crash_before_checkpoint"] += 1
                    report.replays += 1
                    continue
                part.checkpoint = max(part.checkpoint, start + len(batch))  # success or not
        if not busy and all(p.checkpoint >= len(p.events) for p in partitions):
            return
        if not busy:
            time.sleep(0.005)


def _invoke(index: int, batch: list[_Event], config: StreamConfig, report: StreamReport, rng: random.Random) -> None:
    properties = [{"message_id": e.own} if e.own else {} for e in batch]
    metadata = {
        "PartitionContext": meta.Datum(json.dumps({"EventHubName": HUB, "PartitionId": str(index)}), "json"),
        "PropertiesArray": meta.Datum(json.dumps(properties), "json"),
    }
    events = [e.as_delivered(metadata) for e in batch]
    for attempt in range(config.retries + 1):
        report.invocations += 1
        context = SimpleNamespace(retry_context=SimpleNamespace(retry_count=attempt, max_retry_count=config.retries))
        try:
            shipments.shipment_tracking(events, context)
            return
        except Crash:
            raise
        except Exception:  # noqa: BLE001 - the host retries by the policy, then checkpoints anyway
            continue
