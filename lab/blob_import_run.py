"""``python -m lab.blob_import_run``: the ``blob-import`` recipe (recipes/prices.py) on one large
file, on the real Azurite blob, queue and table services, delivered as the Functions host's
blob trigger with the Event Grid source delivers it (lab/blob_host.py). The file (``--records``,
10,000) is uploaded; its import dies mid-file (after ``--crash-after`` chunks, half by default)
and the host runs it again once the lease lapses; Event Grid delivers the event twice; the same file is uploaded
again; a corrected file (``--changed`` prices) replaces it. One JSON line: what was applied per
record and the store's requests per record, each step's and in all; exit 1 unless each record
was applied exactly once per content.

Azurite keeps a table in memory and scans a partition for each insert: a file's records share
one partition, so this takes a few minutes here; Table Storage does not slow down so."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient

import recipes
from lab.blob_host import BlobHost
from lab.host import user_function
from shared.idempotency import Delivery, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.imports import CHUNK, FileImport
from shared.idempotency.keys import consumer_partition
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._base import DedupStore
from shared.idempotency.testing import app_settings
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash

CONTAINER, FILE = "imports", "prices/2026-12.jsonl"


def price_lines(
    count: int, *, changed: dict[int, float] | None = None, removed: set[int] | frozenset[int] = frozenset()
) -> bytes:
    """A price list of ``count`` SKUs (``s-<i>`` at i/10 EUR) as JSON Lines, some prices changed, some lines removed."""
    changed = changed or {}
    return b"".join(json.dumps({"sku": f"s-{i}", "price": changed.get(i, i / 10), "currency": "EUR"}).encode() + b"\n"
                    for i in range(count) if i not in removed)  # fmt: skip


def applied_prices(store: DedupStore, partition: str) -> Counter[tuple[str, int]]:
    """How many times each (sku, version) was applied: exactly once each, or a double effect."""
    found: Counter[tuple[str, int]] = Counter()
    for item in store.scan(partition):
        if item.entity is not None and item.entity.endswith("|price"):  # "<key hash>|<version>|price"
            found[(str(item.data["sku"]), int(item.entity.split("|")[1]))] += 1
    return found


def per_sku(applied: Counter[tuple[str, int]]) -> Counter[str]:
    """How many versions of each sku were applied."""
    return Counter(sku for sku, _ in applied.elements())


def run(records: int = 10_000, crash_after: int | None = None, changed: int = 100) -> dict[str, Any]:
    """``crash_after``: the chunks committed before the crash (default: half the file's)."""
    chunks = -(-records // CHUNK)
    crash_after = crash_after or max(1, chunks // 2)
    with (tempfile.TemporaryDirectory() as folder, Azurite(Path(folder)) as table, Azurite(service="blob") as blobs,
          Azurite(service="queue") as queues,
          app_settings(DEDUP_STORAGE_CONNECTION=table.connection_string, DEDUP_TABLE="t" + uuid.uuid4().hex[:12],
                       DEDUP_DEADLETTER_TABLE="d" + uuid.uuid4().hex[:12], IMPORTS_CONTAINER=CONTAINER,
                       ImportsConnection=blobs.connection_string)):  # fmt: skip
        return _run(table, blobs, queues, records, crash_after, changed)


def _run(table: Azurite, blobs: Azurite, queues: Azurite, records: int, crash_after: int,
         changed: int) -> dict[str, Any]:  # fmt: skip
    shared_store().create_tables()  # type: ignore[attr-defined]
    consumer: FileImport = recipes.module("prices").prices_import()
    sent: list[str] = []
    service = TableServiceClient.from_connection_string(
        table.connection_string, raw_request_hook=lambda r: sent.append(r.http_request.method))  # fmt: skip
    base = consumer.store
    assert isinstance(base, TableStore)
    consumer.store = TableStore(service, base.table.table_name, base.dead_letter_table)
    chunks: list[int] = []
    process_batch = consumer.process_batch

    def dies_once(deliveries: Sequence[Delivery]) -> list[Result]:
        answered = process_batch(deliveries)
        chunks.append(len(deliveries))
        if len(chunks) == crash_after:
            raise Crash("mid-file")
        return answered

    consumer.process_batch = dies_once  # type: ignore[method-assign]
    host = BlobHost(blobs.connection_string, queues.connection_string, CONTAINER, user_function("price_import"),
                    lease=timedelta(seconds=1))  # fmt: skip
    partition = consumer_partition("prices", f"{CONTAINER}/{FILE}")
    steps: dict[str, dict[str, Any]] = {}

    def step(name: str, *events: dict[str, Any]) -> None:
        before, started = len(sent), time.perf_counter()
        host.notify(list(events))
        host.drain(timeout=1800)
        steps[name] = {"requests": len(sent) - before, "seconds": round(time.perf_counter() - started, 1)}

    content = price_lines(records)
    event = host.upload(FILE, content)
    step("import with a crash mid-file", event)
    step("the event again", event)
    step("the same content uploaded again", host.upload(FILE, content))
    corrected = price_lines(records, changed={i * (records // changed): 0.01 for i in range(changed)})
    step("a corrected file", host.upload(FILE, corrected))
    applied = applied_prices(consumer.store, partition)
    expected = Counter({f"s-{i}": 1 for i in range(records)})
    expected.update({f"s-{i * (records // changed)}": 1 for i in range(changed)})  # a second version each
    counted, current = per_sku(applied), consumer.current(f"{CONTAINER}/{FILE}", "price")
    total = sum(step["requests"] for step in steps.values())
    return {
        "records": records, "changed": changed, "steps": steps,
        "invocations": host.listener.tally.invocations, "crashes": host.listener.tally.crashes,
        "applied": sum(applied.values()), "applied_twice": sum(1 for n in applied.values() if n > 1),
        "not_applied": sum(1 for sku in expected if counted[sku] < expected[sku]),
        "unexpected": sum(1 for sku in counted if counted[sku] > expected[sku]),
        "not_current": sum(1 for p in map(json.loads, corrected.splitlines()) if current.get(p["sku"]) != p),
        "poisoned": len(host.poisoned()),
        "dead_lettered": len(consumer.store.dead_letters("prices")),
        "requests": total, "requests_per_record": round(total / records, 4),
    }  # fmt: skip


def violations(report: dict[str, Any]) -> dict[str, Any]:
    """What must be zero (a double or missing application, a poisoned blob, a dead letter), and
    a run that did not crash mid-file as asked."""
    found = {name: report[name] for name in ("applied_twice", "not_applied", "unexpected", "not_current", "poisoned",
                                             "dead_lettered") if report[name]}  # fmt: skip
    if report["crashes"] != 1:
        found["crashes"] = report["crashes"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.blob_import_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--crash-after", type=int, default=None,
                        help=f"chunks ({CHUNK} records each) committed before the crash (default: half)")  # fmt: skip
    parser.add_argument("--changed", type=int, default=100)
    args = parser.parse_args(argv)
    report = run(args.records, args.crash_after, args.changed)
    print(json.dumps(report))
    found = violations(report)
    if found:
        print(f"blob import: {found}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
