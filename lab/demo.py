"""`make demo`: the real `orders` function under an at-least-once delivery stream,
against a real Azurite (or, with DEDUP_STORE=cosmos, the local Cosmos DB emulator).
Last line: one JSON object counted from what is in the store.

Environment: DEDUP_STORE (table | cosmos), DEMO_RUNTIME (process | worker: the real
Functions Python worker, which needs FUNCTIONS_PYTHON_WORKER or `make worker`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from contextlib import ExitStack

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricsData, PeriodicExportingMetricReader

from consumers import orders
from lab import other_triggers, runtimes, workload
from lab.cosmos_emulator import CosmosEmulator, use_cosmos_emulator
from lab.harness import Report, RunConfig, Target, audit_line, run
from lab.order_effects import effects_by_order
from shared.idempotency import IdempotentConsumer
from shared.idempotency.stores import DedupStore
from shared.idempotency.testing import reset
from shared.idempotency.testing.azurite import Azurite


def orders_consumer(connection: str, table: str) -> IdempotentConsumer:
    """Configure the app as its settings would, and return the function's consumer."""
    os.environ.update(DEDUP_STORAGE_CONNECTION=connection, DEDUP_TABLE=table, DEDUP_DEADLETTER_TABLE=table + "dl")
    reset()
    return orders.queue_consumer()


def charges_per_order(store: DedupStore) -> dict[str, int]:
    return {order_id: found.charges for order_id, found in effects_by_order(store).items()}


# The harness's target in `make demo` and `make chaos`: the `orders` function, on orders.
ORDERS = Target("orders", orders_consumer, workload.generate, charges_per_order, "PAYMENT_API_URL", "orderId")


def summary(report: Report) -> str:
    """What happened, in figures that add up: every delivery has one outcome (or failed and
    went back to the queue), and the refused deliveries are the dead-lettered messages' copies."""
    duplicates = report.deliveries - report.messages
    outcomes = report.outcomes
    failed = report.deliveries - sum(outcomes.values())  # raised before an outcome: abandoned, redelivered
    refused = outcomes["invalid"] + outcomes["conflict"]
    return "\n".join(
        [
            f"Sent {report.sends} messages for {report.messages} logical orders "
            f"({report.dropped_by_detection} producer retries dropped by send-side duplicate detection).",
            f"{report.config.workers} competing workers received {report.deliveries} deliveries: "
            f"{duplicates} of them ({duplicates / max(report.deliveries, 1):.0%}) were duplicates.",
            f"Outcomes of the {report.deliveries} deliveries: "
            + ", ".join(f"{name} {count}" for name, count in outcomes.most_common())
            + (f", {failed} failed and went back to the queue" if failed else "")
            + ".",
            f"In the store: {report.effects_applied} orders charged once; {report.dead_lettered} messages "
            f"dead-lettered with a reason (the {refused} invalid or conflicting deliveries: a refused message's "
            f"copies are recorded once); {report.double_effects} double charges, {report.lost} lost.",
        ]
    )


def compact(data: MetricsData) -> str:
    """One line per data point of the dedup metrics, for the console exporter."""
    lines = ["Telemetry (OpenTelemetry console exporter):"]
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    labels = ",".join(f"{k}={v!s}" for k, v in sorted((point.attributes or {}).items()))
                    value = getattr(point, "value", None)
                    count, total = getattr(point, "count", 0), getattr(point, "sum", 0)
                    shown = value if value is not None else f"count={count} sum={total:.0f}"
                    lines.append(f"  {metric.name}{{{labels}}} {shown}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="show the dedup log lines too")
    args = parser.parse_args(argv)
    # The idempotency log (its conflicts are errors: alerts) is counted in the summary, and
    # shown only with --verbose; other errors still show.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    if not args.verbose:
        logging.getLogger("idempotency").setLevel(logging.CRITICAL)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(formatter=compact), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    runtime = os.environ.get("DEMO_RUNTIME", "process")
    config = RunConfig(messages=1200, workers=8, dup_rate=0.5, seed=7, table="demoorders", runtime=runtime,
                       show_log=args.verbose)  # fmt: skip
    with ExitStack() as stack:
        azurite = stack.enter_context(Azurite())
        if os.environ.get("DEDUP_STORE", "table") == "cosmos":
            print(f"Store: Cosmos DB (local emulator), container {config.table} partitioned by /partitionKey")
            use_cosmos_emulator(stack.enter_context(CosmosEmulator()), config.table)
        else:
            print(f"Store: Azure Table Storage (Azurite), table {config.table}")
        print(f"Runtime: {'the real Azure Functions Python worker (gRPC)' if runtime == 'worker' else 'in process'}")
        report = run(config, azurite, ORDERS)
        with runtimes.started(runtime) as functions:
            triggers = other_triggers.drive(functions)
    print(summary(report))
    print(audit_line(report))
    print(triggers.summary())
    provider.shutdown()  # exports once, now: the JSON line must stay the last
    for violation in report.violations:
        print("VIOLATION", violation)
    consistent = report.effects_applied == report.messages - report.dead_lettered
    print(
        json.dumps(
            {
                "messages": report.messages,
                "deliveries": report.deliveries,
                "effects_applied": report.effects_applied,
                "duplicates_suppressed": report.outcomes["duplicate"],
                "dead_lettered": report.dead_lettered,
                "double_effects": report.double_effects,
                "lost": report.lost,
            }
        )
    )
    return 0 if report.ok and consistent and triggers.ok else 1


if __name__ == "__main__":
    sys.exit(main())
