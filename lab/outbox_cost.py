"""What the outbox sweep costs, measured on Azurite: `python -m lab.outbox_cost`.

- As the table grows: for each table size (orders committed with their outgoing message,
  sent), 20 parked HTTP orders whose send failed are left for the sweep; the sweep's reads and
  its time per parked order are reported, as ratios to the smallest table's (this machine is
  shared and noisy). Flat ratios: the cost follows what was parked, not the table.
- Its rate (``--rate N``, and part of `make bench`): a backlog of N parked HTTP orders whose
  send failed, swept in one run once the destination is back: parked orders per second and
  store requests per parked order — the sustained parking rate one sweep keeps up with. The
  sender is the in-memory topic (lab/topic.py): a page's messages go to it in one call, as
  ``ServiceBusSender`` sends them in as few batches as fit (one AMQP send per batch)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

from azure.data.tables import TableServiceClient

from consumers.orders import SCHEMA, order_handler
from lab.topic import SendFailed, Topic
from shared.idempotency import DedupConfig, Delivery, IdempotentConsumer, Outgoing
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import TRANSPORT
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import PeekLockQueue

PARKED = 20


def lean_store(service: TableServiceClient, table: str, options: dict[str, Any]) -> TableStore:
    """A store writing as the app's does by default (DEDUP_TABLE_TRANSACTIONS=lean)."""
    return TableStore(service, table, transactions=TableTransactions.of(service, table, **options))


class Down:
    def send(self, messages: Sequence[Outgoing]) -> None:
        raise SendFailed("the destination is down")


def order(i: int) -> bytes:
    return json.dumps({"orderId": f"o-{i}", "customerId": "c", "amount": 1.0, "currency": "EUR",
                       "items": [{"sku": "a", "quantity": 1}]}).encode()  # fmt: skip


def measure(azurite: Azurite, orders: int) -> dict[str, float]:
    store = lean_store(TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT),
                       f"outbox{orders}", TRANSPORT)  # fmt: skip
    store.create_tables()
    topic = Topic("order-events", {"billing": PeekLockQueue(60, 10, 0)})
    config = DedupConfig(transient_wait=timedelta(0))

    def consumer(sender: object) -> IdempotentConsumer:
        return IdempotentConsumer("orders", store, order_handler(accepted_topic=topic.name), schema=SCHEMA,
                                  config=config, sender=sender)  # type: ignore[arg-type]  # fmt: skip

    sending, down = consumer(topic), consumer(Down())
    for i in range(orders):
        sending.process(Delivery(order(i), message_id=f"o-{i}", delivery_count=1))
    for i in range(orders, orders + PARKED):  # HTTP calls: parked, then their send fails
        down.process(Delivery(order(i), message_id=f"o-{i}"))
    outbox = sending.outbox(topic)
    started = time.perf_counter()
    swept = outbox.sweep(utcnow() + config.outbox_sweep_delay + timedelta(seconds=1), since=timedelta(hours=1))
    seconds = time.perf_counter() - started
    assert (swept.parked, swept.sent, topic.sent) == (PARKED, PARKED, orders + PARKED), swept
    # The control: one range read of one small partition, the sweep's unit of work. Azurite
    # evaluates a query over the whole table in memory; the service reads one partition.
    started = time.perf_counter()
    for _ in range(50):
        store.read_entities("orders|o-0", "", 10)
    control = (time.perf_counter() - started) * 1000 / 50
    return {"orders": orders, "parked": PARKED, "sweep_reads": swept.reads,
            "sweep_ms_per_parked_order": round(seconds * 1000 / PARKED, 2),
            "control_ms_per_partition_read": round(control, 2)}  # fmt: skip


def throughput(azurite: Azurite, parked: int = 500,
               counting: Callable[[], AbstractContextManager[Any]] = nullcontext) -> dict[str, Any]:  # fmt: skip
    """Sweep a backlog of ``parked`` HTTP orders whose send failed, counting its requests (and,
    with ``counting``, what the sweep executes: lab/bench/instructions.py)."""
    requests = [0]
    options = {**TRANSPORT, "raw_request_hook": lambda _: requests.__setitem__(0, requests[0] + 1)}
    store = lean_store(TableServiceClient.from_connection_string(azurite.connection_string, **options),
                       f"sweep{uuid.uuid4().hex[:12]}", options)  # fmt: skip
    store.create_tables()
    topic = Topic("order-events", {"billing": PeekLockQueue(60, 10, 0)})
    config = DedupConfig(transient_wait=timedelta(0))
    down = IdempotentConsumer("orders", store, order_handler(accepted_topic=topic.name), schema=SCHEMA,
                              config=config, sender=Down())  # fmt: skip
    for i in range(parked):
        down.process(Delivery(order(i), message_id=f"o-{i}"))
    outbox = down.outbox(topic)
    requests[0] = 0
    started = time.perf_counter()
    with counting():
        swept = outbox.sweep(utcnow() + config.outbox_sweep_delay + timedelta(seconds=1), since=timedelta(hours=1))
    seconds = time.perf_counter() - started
    assert (swept.parked, swept.sent, swept.failed, topic.sent) == (parked, parked, 0, parked), swept
    return {"parked": parked, "parked_per_s": round(parked / seconds, 1),
            "requests": requests[0], "requests_per_parked": round(requests[0] / parked, 3)}  # fmt: skip


REQUESTS = 2.05  # per parked key: read its rows, delete them (+ its share of the index's reads and deletes)
RUN_SHARE = 4 / 5  # the sweep runs for DEDUP_PURGE_TIME (4 min) of every 5


def sustained(azurite: Azurite, parked: int = 500, runs: int = 3) -> dict[str, Any]:
    """The median of ``runs`` sweeps of a backlog, and the parking rate it sustains."""
    measured = [throughput(azurite, parked) for _ in range(runs)]
    rate = statistics.median(m["parked_per_s"] for m in measured)
    return {"parked": parked, "runs": measured, "parked_per_s": rate,
            "requests_per_parked": max(m["requests_per_parked"] for m in measured),
            "sustainable_per_s": round(rate * RUN_SHARE, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[100, 1000, 10000])
    parser.add_argument("--rate", type=int, metavar="PARKED", help="only the sweep's rate, on a backlog of PARKED")
    args = parser.parse_args(argv)
    with Azurite() as azurite:
        if args.rate:
            print(json.dumps(sustained(azurite, args.rate)))
            return 0
        rows = [measure(azurite, n) for n in args.sizes]
    for row in rows:
        for name in ("sweep_ms_per_parked_order", "control_ms_per_partition_read"):
            row[name.replace("ms", "x_smallest", 1)] = round(row[name] / rows[0][name], 2)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
