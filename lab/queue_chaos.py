"""``python -m lab.queue_chaos``: the ``queue`` recipe (recipes/returns.py) under faults, on the
real Azurite queue and table services. Returns are enqueued, a share twice (a producer's
retry: a new queue message, the same returnId); ``--instances`` listeners (lab/queue_host.py)
compete for them, 8 messages at once each; an instance dies while a function runs (every
message it holds comes back), or a delete is lost; the store is down for ``--outage`` seconds
mid-run. One JSON line; exit 1 on a double effect, a lost return, a poisoned message or a dead
letter.

``--crash-rate`` is per invocation, and a death takes the instance's batch with it: a dequeue
lapses with about 8 x crash-rate + lost-delete-rate, and the host poisons a message only after
``maxDequeueCount`` (5) lapses in a row — about 1e-6 per message at the defaults, with some 15
deaths and 80 lost deletes in a run of 2,000.

Knobs: --messages 2000 --instances 4 --dup-rate 0.3 --crash-rate 0.005 --lost-delete-rate 0.03
--outage 30 --seed 1."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from azure.storage.queue import QueueMessage as StoredMessage

import recipes
from lab.host import user_function
from lab.infra_checks import timespan
from lab.queue_host import QueueHost, Tally, queue_client
from shared.idempotency import Delivery, IdempotentConsumer, Outcome, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.functions._host import HOST_JSON
from shared.idempotency.functions._storage_queue import max_dequeue_count
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import app_settings, entities
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash

VIOLATIONS = ("double", "lost", "left", "poisoned", "dead_lettered", "listener_errors")
LEASE_SECONDS = 2  # scaled down from the host's 10 minutes: a crashed instance's message comes back soon


def run(messages: int = 2000, instances: int = 4, dup_rate: float = 0.3, crash_rate: float = 0.005,
        lost_delete_rate: float = 0.03, outage: float = 30.0, seed: int = 1) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder, Azurite(Path(folder)) as table, Azurite(service="queue") as queues:
        name = "returns-" + uuid.uuid4().hex[:8]
        with app_settings(DEDUP_STORAGE_CONNECTION=table.connection_string, DEDUP_TABLE="t" + uuid.uuid4().hex[:12],
                          DEDUP_DEADLETTER_TABLE="d" + uuid.uuid4().hex[:12], RETURNS_QUEUE=name,
                          StorageQueueConnection=queues.connection_string,
                          DEDUP_TRANSIENT_WAIT=f"PT{int(outage) + 60}S"):  # fmt: skip
            return _run(table, queues.connection_string, name, messages, instances, dup_rate, crash_rate,
                        lost_delete_rate, outage, rng)  # fmt: skip


def _run(table: Azurite, connection: str, name: str, messages: int, instances: int, dup_rate: float,
         crash_rate: float, lost_delete_rate: float, outage: float, rng: random.Random) -> dict[str, Any]:  # fmt: skip
    lock = threading.Lock()
    function = user_function("order_returns")
    consumer: IdempotentConsumer = recipes.module("returns").returns_consumer()
    processed: Counter[str] = Counter()  # the returns each delivery applied: a double effect is a second one
    process_batch = consumer.process_batch

    def counted(deliveries: Sequence[Delivery]) -> list[Result]:
        results = process_batch(deliveries)
        with lock:
            processed.update(r.key.id for r in results if r.outcome is Outcome.PROCESSED and r.key is not None)
        return results

    consumer.process_batch = counted  # type: ignore[method-assign]  # counted as the function calls it
    store = shared_store()
    assert isinstance(store, TableStore)
    store.create_tables()

    rolls = {stage: (random.Random(rng.random()), rate) for stage, rate in (("invoke", crash_rate),
                                                                            ("delete", lost_delete_rate))}  # fmt: skip

    def faults(stage: str, message: StoredMessage) -> None:
        stream, rate = rolls[stage]  # a stream per stage: the n-th invocation's roll is the seed's, whatever the order
        with lock:
            roll = stream.random()
        if roll < rate:
            raise Crash(stage)

    tally = Tally()
    queues = json.loads(HOST_JSON.read_text()).get("extensions", {}).get("queues", {})
    hidden = timespan(queues.get("visibilityTimeout", "00:00:00"))
    hosts = [QueueHost(connection, name, function, faults=faults, tally=tally, batch_size=8, visibility_timeout=hidden,
                       max_dequeue_count=max_dequeue_count(), lease=timedelta(seconds=LEASE_SECONDS))
             for _ in range(instances)]  # fmt: skip
    hosts[0].create_queues()
    bodies: list[dict[str, Any]] = [
        {"returnId": f"r-{i}", "orderId": f"o-{i // 3}", "amount": round(5 + i % 97 * 0.5, 2)} for i in range(messages)
    ]
    sends = [*bodies, *(b for b in bodies if rng.random() < dup_rate)]
    rng.shuffle(sends)
    sender = queue_client(connection, name)
    for body in sends:
        sender.send_message(json.dumps(body).encode())
    started = time.monotonic()
    done = threading.Event()

    errors: list[str] = []

    def listen(host: QueueHost) -> None:
        while not done.is_set():
            try:
                if host.poll() == 0:
                    time.sleep(0.2)
            except Exception as exc:  # noqa: BLE001 - reported, and the listener goes on as the host's does
                errors.append(repr(exc)[:200])
                time.sleep(0.2)

    def break_the_store() -> None:
        while not done.is_set() and tally.deleted < len(sends) // 3:
            time.sleep(0.05)
        if not done.is_set() and (problem := table.outage(outage)) is not None:
            errors.append(problem)

    threads = [threading.Thread(target=listen, args=(host,)) for host in hosts]
    threads.append(threading.Thread(target=break_the_store))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + outage + 600
    try:
        while sender.get_queue_properties().approximate_message_count and time.monotonic() < deadline:
            time.sleep(0.5)  # visible or leased
    finally:
        done.set()
        for thread in threads:
            thread.join()
    seconds = time.monotonic() - started
    stored = Counter(e["returnId"] for e in entities(shared_store(), "return"))
    poisoned = queue_client(connection, f"{name}-poison").get_queue_properties().approximate_message_count or 0
    dead = shared_store().dead_letters("returns")
    return {"returns": messages, "enqueued": len(sends), "instances": len(hosts), "seconds": round(seconds, 1),
            "invocations": tally.invocations, "crashes": tally.crashes,
            "lost_deletes": tally.lost_deletes, "released": tally.released, "outage_s": outage,
            "applied": sum(processed.values()), "double": sum(n - 1 for n in processed.values() if n > 1),
            "lost": sum(1 for b in bodies if not processed[b["returnId"]] or not stored[b["returnId"]]),
            "left": sender.get_queue_properties().approximate_message_count or 0, "poisoned": poisoned,
            "dead_lettered": len(dead), "listener_errors": len(errors)}  # fmt: skip


def violations(report: dict[str, Any]) -> dict[str, int]:
    """What must be 0 for the run to pass, and what it was."""
    return {name: report[name] for name in VIOLATIONS if report[name]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.queue_chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--dup-rate", type=float, default=0.3)
    parser.add_argument("--crash-rate", type=float, default=0.005)
    parser.add_argument("--lost-delete-rate", type=float, default=0.03)
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    report = run(args.messages, args.instances, args.dup_rate, args.crash_rate, args.lost_delete_rate, args.outage,
                 args.seed)  # fmt: skip
    print(json.dumps(report))
    return 1 if violations(report) else 0


if __name__ == "__main__":
    raise SystemExit(main())
