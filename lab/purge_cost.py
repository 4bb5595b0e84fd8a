"""What the purge of expired markers costs on Table Storage, measured on Azurite:
`python -m lab.purge_cost [expired] [--factors 10,100]`.

For each factor F, a table holds ``expired`` expired markers (each with its guard and its
order) among F times their records again as live data (in bulk). The purge the timer runs
(``purge_expired``, following the expiry index) deletes them; the runs at each size are
interleaved. Reported per purged marker: time and requests, and the sustainable rate:
markers deleted per second of a run times the share of time the purge may run
(DEDUP_PURGE_TIME, 4 min, every 5 minutes), one marker per message.

Flat means the purge does no work that grows with the table: the same requests per marker,
and the same time per marker *relative to what one such delete costs the server at that
size*. Azurite keeps each table in one in-memory collection whose every write slows as it
grows (a marker-and-guard delete took 1.1-1.4 ms at 15,000 entities and 2.1-2.8 ms at
150,000 in one measurement, with no index involved), so each run also times a control: as
many marker-and-guard pairs, written alongside the expired markers in partitions of their
own (where an entity sits in the collection counts too), deleted with the purge's own
transaction and concurrency. ``time_per_marker_ratio`` compares the purge's time per marker
over the control's (taken in each run, then the median of the runs), largest table over
smallest (flat: 1.0); the absolute times are reported beside it. (The full sweep's filtered
scan is no control either: Azurite filters its in-memory table in one page, where the service
reads every entity.)"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

from azure.data.tables import TableServiceClient

from shared.idempotency import Entity
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import TRANSPORT
from shared.idempotency.stores._expiry import CONCURRENCY, Note
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.testing.azurite import Azurite

FLAT = 1.2  # the target: time per marker relative to the control, largest table over smallest
PURGE_SHARE = 4 / 5  # DEDUP_PURGE_TIME (PT4M) of every 5 minutes (the timer's schedule)
FILLER_PER_PARTITION = 100  # live entities per bulk transaction


class Counted:
    """A lean store on new tables whose requests are counted."""

    def __init__(self, azurite: Azurite) -> None:
        self.requests = 0
        options = {**TRANSPORT, "raw_request_hook": self._count}
        self.service = TableServiceClient.from_connection_string(azurite.connection_string, **options)
        self.name = "p" + uuid.uuid4().hex[:16]
        lean = TableTransactions.of(self.service, self.name, **options)
        self.store = TableStore(self.service, self.name, self.name + "dl", transactions=lean)
        self.store.create_tables()
        self.lean = lean

    def _count(self, request: Any) -> None:
        self.requests += 1

    def drop(self) -> None:
        for table in (self.name, self.name + "dl"):
            self.service.delete_table(table)


def seed(target: Counted, expired: int, factor: int) -> None:
    """``expired`` expired markers with their orders, and ``factor`` times their records
    (marker, guard, order) again as live data: live orders with their markers, and bulk entities."""
    now = utcnow()
    for i in range(expired):
        key = DedupKey("orders", f"old-{i}")
        target.store.commit(key, key.id, "fp", [Entity("order", {"orderId": key.id})], None, now - timedelta(hours=2))
    for note in controls(expired):  # the control's pairs, written alongside
        rows = [("create", {"PartitionKey": note.partition, "RowKey": key}) for key in (note.marker, note.guard)]
        assert isinstance(target.lean.submit(rows), list)
    live = expired * 3 * factor
    for start in range(0, live, FILLER_PER_PARTITION):
        pk = f"live-{start}"
        filler: list[Any] = [("create", {"PartitionKey": pk, "RowKey": f"order-{i}", "amount": 1.0})
                             for i in range(min(FILLER_PER_PARTITION, live - start))]  # fmt: skip
        assert isinstance(target.lean.submit(filler), list)
    target.store._expiry.flush()


def run(azurite: Azurite, expired: int, factor: int,
        counting: Callable[[], AbstractContextManager[Any]] = nullcontext) -> dict[str, float]:  # fmt: skip
    """One purge of ``expired`` markers in a table ``factor`` times their records; with
    ``counting``, what the purge executes is counted (lab/bench/instructions.py)."""
    target = Counted(azurite)
    try:
        target.store.purge_expired(utcnow(), budget=1)  # a store in service has its cursor
        seed(target, expired, factor)
        pairs = controls(expired)
        before = control_ms(target, pairs[: expired // 2])  # half before the purge, half after: the drift cancels
        target.requests = 0
        started = time.perf_counter()
        with counting():
            purge = target.store.purge_expired(utcnow(), budget=10 * expired)
        seconds = time.perf_counter() - started
        requests = target.requests
        control = (before + control_ms(target, pairs[expired // 2 :])) / 2
        assert purge.deleted == 2 * expired, purge  # every expired marker and its guard, nothing else
        return {"ms_per_marker": seconds * 1000 / expired, "control_ms_per_delete": control,
                "relative_to_control": seconds * 1000 / expired / control,
                "requests_per_marker": requests / expired, "markers_per_s": expired / seconds}  # fmt: skip
    finally:
        target.drop()


def controls(pairs: int) -> list[Note]:
    return [Note(f"control-{i}", "m", "", "g") for i in range(pairs)]


def control_ms(target: Counted, notes: list[Note]) -> float:
    """Time per delete of these marker-and-guard pairs seeded beside the expired markers
    (Azurite's cost of a delete also depends on where its entity sits in the collection), with
    the purge's own transaction and concurrency."""
    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        deleted = sum(done for done, _ in pool.map(lambda n: target.store._delete_noted(n.partition, [n]), notes))
    assert deleted == 2 * len(notes)
    return (time.perf_counter() - started) * 1000 / len(notes)


def measure(
    azurite: Azurite, expired: int = 1000, factors: Sequence[int] = (10, 100), repeats: int = 2
) -> dict[str, Any]:
    """Interleaved: every size once per repeat, so that the machine's drift hits all alike."""
    runs: dict[int, list[dict[str, float]]] = {factor: [] for factor in factors}
    for _ in range(repeats):
        for factor in factors:
            runs[factor].append(run(azurite, expired, factor))
    median = {factor: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for factor, rs in runs.items()}
    small, large = median[factors[0]], median[factors[-1]]
    flatness = large["relative_to_control"] / small["relative_to_control"]
    return {
        "expired_markers": expired,
        "per_table_factor": {f"{factor}x": {k: round(v, 3) for k, v in m.items()} for factor, m in median.items()},
        "relative_to_control_per_run": {f"{factor}x": [round(r["relative_to_control"], 3) for r in rs]
                                        for factor, rs in runs.items()},
        "time_per_marker_ratio": round(flatness, 3),
        "flat": flatness <= FLAT,
        "absolute_time_ratio": round(large["ms_per_marker"] / small["ms_per_marker"], 3),
        "control_time_ratio": round(large["control_ms_per_delete"] / small["control_ms_per_delete"], 3),
        "requests_per_marker": round(large["requests_per_marker"], 3),
        "purge_share": PURGE_SHARE,
        "sustainable_messages_per_s": round(min(m["markers_per_s"] for m in median.values()) * PURGE_SHARE, 1),
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("expired", type=int, nargs="?", default=1000, help="expired markers per table")
    parser.add_argument("--factors", default="10,100", help="table sizes, as multiples of the expired records")
    parser.add_argument("--repeats", type=int, default=2)
    arguments = parser.parse_args()
    factors = tuple(int(f) for f in arguments.factors.split(","))
    with Azurite() as server:
        print(json.dumps(measure(server, arguments.expired, factors, arguments.repeats), indent=1))
