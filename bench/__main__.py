"""`make bench`: what the dedup layer adds to every message, against Azurite started here.

Every HTTP request the store clients send is counted (azure-core ``raw_request_hook``),
every scenario runs BENCH_REPEATS times (default 3, interleaved so that the machine's
noise hits all alike), and throughput is reported as a ratio to the baseline measured in
the same run. The CPU each message costs the client (this process, SDK threads included)
and Azurite is measured too, so that a run shows where added time goes. Writes
bench/results/latest.{json,md,png}; exits non-zero when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient
from jsonschema import Draft202012Validator

from shared import ledger
from shared.idempotency import Delivery, Effects, IdempotentConsumer
from shared.idempotency.consumer import parse_json
from shared.idempotency.keys import encode_key
from shared.idempotency.settings import DedupConfig
from shared.idempotency.steps import Context
from shared.idempotency.table_store import TableStore
from shared.orders import SCHEMA, order_handler
from tools.azurite import Azurite

RESULTS = Path(__file__).resolve().parent / "results"
TRANSPORT = {"retry_total": 0}  # a benchmark must not hide failures behind retries


@dataclass
class Measure:
    messages: int
    seconds: float
    requests: int
    latencies_ms: list[float]
    client_cpu: float  # seconds of this process's CPU (SDK threads included)
    store_cpu: float  # seconds of Azurite's CPU


class Bench:
    def __init__(self, azurite: Azurite, messages: int) -> None:
        self.azurite = azurite
        self.n = messages
        self.sent = 0

    def store(self) -> TableStore:
        def count(request: Any) -> None:
            self.sent += 1

        service = TableServiceClient.from_connection_string(
            self.azurite.connection_string, raw_request_hook=count, **TRANSPORT
        )
        name = "b" + uuid.uuid4().hex[:16]
        store = TableStore(service, name, name + "dl")
        store.create_tables()
        return store

    def timed(self, calls: list[Callable[[], Any]], sizes: list[int] | None = None) -> Measure:
        """Run the calls one after another; ``sizes``: messages per call (default 1 each)."""
        sizes = sizes or [1] * len(calls)
        self.sent = 0
        latencies = []
        client, store, started = time.process_time(), self.azurite.cpu_seconds(), time.perf_counter()
        for call, size in zip(calls, sizes, strict=True):
            t = time.perf_counter()
            call()
            latencies += [(time.perf_counter() - t) * 1000 / size] * size
        return Measure(sum(sizes), time.perf_counter() - started, self.sent, latencies,
                       time.process_time() - client, self.azurite.cpu_seconds() - store)  # fmt: skip


def orders(n: int, run: str) -> list[Delivery]:
    deliveries = []
    for i in range(n):
        order = {"orderId": f"{run}-{i}", "customerId": "c-1", "amount": 10.0 + i % 7, "currency": "EUR",
                 "items": [{"sku": "a", "quantity": 1}]}  # fmt: skip
        deliveries.append(Delivery(json.dumps(order).encode(), message_id=str(order["orderId"])))
    return deliveries


def raw_limit(bench: Bench) -> Measure:
    store = bench.store()
    calls = [lambda i=i: store.table.create_entity({"PartitionKey": f"p{i}", "RowKey": "r"}) for i in range(bench.n)]
    return bench.timed(calls)  # type: ignore[arg-type]


def raw_transaction(size: int) -> Callable[[Bench], Measure]:
    """Transactions of ``size`` plain inserts, nothing else: 4 against 2 is what a guard and
    a marker add to the baseline's two business entities in the SDK alone — the ceiling
    of atomic/baseline on this machine, whatever the consumer does."""

    def scenario(bench: Bench) -> Measure:
        store = bench.store()
        calls = [lambda i=i: store.table.submit_transaction(
                     [("create", {"PartitionKey": f"p{i}", "RowKey": f"r{j}", "Value": "x" * 40}) for j in range(size)])
                 for i in range(bench.n)]  # fmt: skip
        return bench.timed(calls)  # type: ignore[arg-type]

    return scenario


def baseline(bench: Bench) -> Measure:
    """The same consumer without dedup: parse, validate, the same handler, and the same
    business entities (order + ledger posting) in one transaction — no key, no
    fingerprint, no marker."""
    store = bench.store()
    validator = Draft202012Validator(SCHEMA)
    handler = order_handler(key_is_order_id=False)

    def consume(delivery: Delivery) -> None:
        order = parse_json(delivery.body)
        validator.validate(order)
        effects = handler(order, None)  # type: ignore[arg-type]  # needs no context without steps
        assert isinstance(effects, Effects)
        pk = encode_key(order["orderId"])
        store.table.submit_transaction([("create", TableStore.effect_entity(pk, e)) for e in effects.entities])

    return bench.timed([lambda d=d: consume(d) for d in orders(bench.n, uuid.uuid4().hex[:6])])  # type: ignore[misc]


def consumer(store: TableStore, handler: Any, cache: int = 0, **options: Any) -> IdempotentConsumer:
    return IdempotentConsumer("bench", store, handler, schema=options.pop("schema", SCHEMA),
                              config=DedupConfig(cache_size=cache), **options)  # fmt: skip


def atomic(bench: Bench) -> Measure:
    flow = consumer(bench.store(), order_handler())
    return bench.timed([lambda d=d: flow.process(d) for d in orders(bench.n, uuid.uuid4().hex[:6])])  # type: ignore[misc]


def two_phase(bench: Bench) -> Measure:
    """Claim the step, make the (in-process) call, complete it, then commit the order."""
    orders_handler = order_handler()

    def handler(order: dict[str, Any], context: Context) -> Effects:
        context.step("charge", lambda key: {"id": key})
        effects = orders_handler(order, context)
        assert isinstance(effects, Effects)
        return effects

    flow = consumer(bench.store(), handler)
    return bench.timed([lambda d=d: flow.process(d) for d in orders(bench.n, uuid.uuid4().hex[:6])])  # type: ignore[misc]


def duplicates(rate: float, cache: int) -> Callable[[Bench], Measure]:
    """A stream where ``rate`` of the deliveries repeat an earlier message, mismatch
    detection included (every commit can tell new, same payload, other payload)."""

    def scenario(bench: Bench) -> Measure:
        flow = consumer(bench.store(), order_handler(), cache=cache)
        unique = orders(max(1, round(bench.n * (1 - rate))), uuid.uuid4().hex[:6])
        stream = [unique[i] if i < len(unique) else unique[i % len(unique)] for i in range(bench.n)]
        return bench.timed([lambda d=d: flow.process(d) for d in stream])  # type: ignore[misc]

    return scenario


def batch(size: int) -> Callable[[Bench], Measure]:
    """The ledger consumer's batch path: postings to one account, ``size`` per batch."""

    def scenario(bench: Bench) -> Measure:
        flow = consumer(bench.store(), ledger.posting_handler, schema=ledger.SCHEMA, partition_for=ledger.account_of)
        account = "acc" + uuid.uuid4().hex[:6]
        deliveries = [Delivery(json.dumps({"accountId": account, "postingId": f"p{i}", "amount": 1.0,
                                           "currency": "EUR"}).encode(), message_id=ledger.message_id(account, f"p{i}"))
                      for i in range(bench.n)]  # fmt: skip
        batches = [deliveries[i : i + size] for i in range(0, len(deliveries), size)]
        calls = [lambda b=b: flow.process_batch(b) for b in batches]
        return bench.timed(calls, [len(b) for b in batches])  # type: ignore[arg-type]

    return scenario


SCENARIOS: dict[str, Callable[[Bench], Measure]] = {
    "raw store limit (single inserts)": raw_limit,
    "raw transaction of 2 inserts": raw_transaction(2),
    "raw transaction of 4 inserts": raw_transaction(4),
    "baseline (effects, no dedup)": baseline,
    "atomic (marker + effects)": atomic,
    "two-phase (claim, call, complete, commit)": two_phase,
    "duplicates 10%": duplicates(0.1, cache=0),
    "duplicates 50%": duplicates(0.5, cache=0),
    "duplicates 90%": duplicates(0.9, cache=0),
    "duplicates 90%, hot cache": duplicates(0.9, cache=100_000),
    "batch of 1": batch(1),
    "batch of 10": batch(10),
    "batch of 100": batch(100),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    n = int(os.environ.get("BENCH_MESSAGES", "2000"))
    repeats = max(3, int(os.environ.get("BENCH_REPEATS", "3")))
    runs: dict[str, list[Measure]] = {name: [] for name in SCENARIOS}
    with Azurite() as azurite:
        bench = Bench(azurite, n)
        for repeat in range(repeats):
            for name, scenario in SCENARIOS.items():
                runs[name].append(scenario(bench))
                print(f"[{repeat + 1}/{repeats}] {name}: {runs[name][-1].messages / runs[name][-1].seconds:.0f} msg/s",
                      file=sys.stderr)  # fmt: skip
    rows: list[dict[str, Any]] = []
    base = statistics.median(m.messages / m.seconds for m in runs["baseline (effects, no dedup)"])
    for name, measures in runs.items():
        rate = statistics.median(m.messages / m.seconds for m in measures)
        latencies = [lat for m in measures for lat in m.latencies_ms]
        rows.append({
            "scenario": name,
            "messages_per_s": round(rate, 1),
            "ratio_to_baseline": round(rate / base, 3),
            "requests_per_message": round(statistics.median(m.requests / m.messages for m in measures), 4),
            "p50_ms": round(percentile(latencies, 0.5), 2),
            "p99_ms": round(percentile(latencies, 0.99), 2),
            "client_cpu_ms": round(statistics.median(m.client_cpu * 1000 / m.messages for m in measures), 3),
            "store_cpu_ms": round(statistics.median(m.store_cpu * 1000 / m.messages for m in measures), 3),
        })  # fmt: skip
    by_name = {row["scenario"]: row for row in rows}
    checks: dict[str, bool] = {
        "atomic: exactly 1.0 store request per new message": by_name["atomic (marker + effects)"][
            "requests_per_message"] == 1.0,
        "atomic: throughput >= 0.9x baseline": by_name["atomic (marker + effects)"]["ratio_to_baseline"] >= 0.9,
        "duplicates: <= 1.0 request per message at 10/50/90%": all(
            by_name[f"duplicates {r}%"]["requests_per_message"] <= 1.0 for r in (10, 50, 90)),
        "hot duplicates cost no request (90%: <= 0.1 per message)": by_name["duplicates 90%, hot cache"][
            "requests_per_message"] <= 0.1 + 1e-9,
        "batch of 100 in one partition: <= 0.05 request per message": by_name["batch of 100"][
            "requests_per_message"] <= 0.05,
    }  # fmt: skip
    # Two more operations per transaction cost this much in the SDK alone (same run).
    ceiling = by_name["raw transaction of 4 inserts"]["messages_per_s"] / by_name["raw transaction of 2 inserts"][
        "messages_per_s"]  # fmt: skip
    report = {"messages_per_scenario": n, "repeats": repeats, "scenarios": rows, "targets": checks,
              "sdk_ceiling_atomic_vs_baseline": round(ceiling, 3)}  # fmt: skip
    write(report)
    for target, ok in checks.items():
        print(("PASS " if ok else "MISS ") + target)
    return 0 if all(checks.values()) else 1


def write(report: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"Azurite, {report['messages_per_scenario']} messages per scenario, median of {report['repeats']} runs; "
        "throughput as a ratio to the baseline measured in the same run; CPU per message split between "
        "this client (Python, Azure SDK) and Azurite.",
        "",
        "| scenario | messages/s | x baseline | store requests / message | p50 ms | p99 ms "
        "| client CPU ms / message | Azurite CPU ms / message |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["scenarios"]:
        lines.append(f"| {row['scenario']} | {row['messages_per_s']:.0f} | {row['ratio_to_baseline']:.2f} | "
                     f"{row['requests_per_message']:.3f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | "
                     f"{row['client_cpu_ms']:.2f} | {row['store_cpu_ms']:.2f} |")  # fmt: skip
    lines += ["", *[f"- {'PASS' if ok else 'MISS'}: {target}" for target, ok in report["targets"].items()]]
    lines += ["", f"Ceiling of atomic vs baseline set by the SDK alone (a 4-insert transaction against a 2-insert one, "
                  f"same run): {report['sdk_ceiling_atomic_vs_baseline']:.2f}x."]  # fmt: skip
    (RESULTS / "latest.md").write_text("\n".join(lines) + "\n")
    chart(report["scenarios"])
    print("\n".join(lines))


def chart(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["scenario"] for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    left.barh(names, [row["messages_per_s"] for row in rows], color="#2b6cb0")
    left.set_xlabel("messages / s (median)")
    right.barh(names, [row["requests_per_message"] for row in rows], color="#c05621")
    right.set_xlabel("store requests / message")
    right.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    left.invert_yaxis()
    figure.suptitle("Idempotent consumer on Azurite: throughput and store round trips")
    figure.tight_layout()
    figure.savefig(RESULTS / "latest.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
