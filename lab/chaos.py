"""`make chaos`: the `orders` function under at-least-once delivery, competing workers,
injected faults and a store outage; then, at the shipped proportions with 16 concurrent calls
and no resubmission from the broker's dead-letter queue, store outages of 2, 10 and 30 s and
30% of store requests answered 503 for 10 s. Exits non-zero on any violated invariant (a
message left in the broker's DLQ is one).

Knobs (environment): CHAOS_MESSAGES (5000), CHAOS_WORKERS (8), CHAOS_DUP_RATE (0.3),
CHAOS_FAULT_RATE (0.05), CHAOS_SEED (random when unset), CHAOS_OUTAGE (1),
CHAOS_PAYMENTS (0; 1 = charge through a local payment API, a two-phase step), CHAOS_RUNTIME
(process; worker = deliver through the real Functions Python worker: store faults then cannot
be injected inside it, delivery faults and the outage still are), CHAOS_SETTLED_WITHOUT_INVOKE
(0; 0.005 = the host completes 0.5% of first deliveries without invoking the function, as in
Azure/azure-functions-host#11879: every run's audit must name exactly those, by sequence
number, and close its accounting identity on the rest), CHAOS_SCHEDULED_RATE (0.02 of the
producer's sends are scheduled messages, delivered up to a lock duration later), CHAOS_TROUBLE_MESSAGES (600;
0 skips the outage and throttling runs), CHAOS_CHAIN_MESSAGES (2000; 0 skips the outbox run:
orders → order-events → billing + shipping with faults at every hop, lab/chain.py),
CHAOS_STREAM_EVENTS (3000; 0 skips the Event Hubs run: checkpoints after every batch,
crashes, rebalances, producer retries, parking and replay, lab/eventhub.py),
CHAOS_SESSION_ORDERS (500; 0 skips the Service Bus sessions run, lab/sessions.py),
CHAOS_QUEUE_RETURNS (2000; 0 skips the Storage queue run on the real Azurite queue service: 4
instances, crashes, lost deletes, a 30 s store outage, lab/queue_chaos.py), CHAOS_IMPORT_RECORDS
(10000; 0 skips the blob import of one file on the real Azurite blob and queue services: a crash
mid-file, a duplicate event, a re-upload, a corrected file, lab/blob_import_run.py),
BALANCES_MESSAGES (5000; 0 skips the running balances of 50 accounts on Table Storage, both
transports, and MemoryStore: every balance the sum of its distinct entries, lab/balances_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab import blob_import_run as blob_import
from lab.balances_chaos import config_from_env as balances_config
from lab.balances_chaos import run_on as run_balances
from lab.balances_chaos import summary as balances_summary
from lab.chain import ChainConfig, ChainReport, run_chain
from lab.demo import ORDERS
from lab.eventhub import StreamConfig, StreamReport, run_stream
from lab.harness import Report, RunConfig, audit_line, rate, run, seed_setting
from lab.queue_chaos import run as run_queue
from lab.queue_chaos import violations
from lab.sessions import SessionConfig, SessionReport, run_sessions
from shared.idempotency.config import whole
from shared.idempotency.errors import ConfigurationError
from shared.idempotency.testing.azurite import Azurite


def config_from_env() -> RunConfig:
    env = os.environ.get
    return RunConfig(
        messages=whole("CHAOS_MESSAGES", "5000"),
        workers=whole("CHAOS_WORKERS", "8"),
        dup_rate=rate("CHAOS_DUP_RATE", "0.3"),
        fault_rate=rate("CHAOS_FAULT_RATE", "0.05"),
        seed=seed_setting(),
        outage=env("CHAOS_OUTAGE", "1") == "1",
        payments=env("CHAOS_PAYMENTS", "0") == "1",
        table="chaosorders",
        runtime=env("CHAOS_RUNTIME", "process"),
        settled_without_invoke=rate("CHAOS_SETTLED_WITHOUT_INVOKE", "0"),
        scheduled_rate=rate("CHAOS_SCHEDULED_RATE", "0.02"),
    )


def as_json(report: Report) -> dict[str, object]:
    return {
        "messages": report.messages,
        "deliveries": report.deliveries,
        "workers": report.config.workers,
        "faults_injected": sum(report.faults.values()),
        "store_restarts": report.store_restarts,
        "effects_applied": report.effects_applied,
        "double_effects": report.double_effects,
        "lost": report.lost,
        "dead_lettered": report.dead_lettered,
        "orphans": report.orphans,
        "seed": report.config.seed,
        "payments": report.config.payments,
        "payment_charges_accepted": report.payment_charges,
        "faults": dict(sorted(report.faults.items())),
        "settled_without_invoke": len(report.vanished),
        "scheduled": report.scheduled,
        "audit": report.audit,
        "outcomes": dict(sorted(report.outcomes.items())),
        "lock_expiries": report.lock_expiries,
        "locks_lost": report.locks_lost,
        "broker_dead_lettered": report.broker_dead_lettered,
        "resubmitted_by_an_operator": report.resubmitted,
        "seconds": round(report.seconds, 1),
        "runtime": report.config.runtime,
    }


# The runs' sizes (0 skips one), with their defaults (the docstring's knobs).
SIZES = {"CHAOS_CHAIN_MESSAGES": "2000", "CHAOS_STREAM_EVENTS": "3000", "CHAOS_SESSION_ORDERS": "500",
         "CHAOS_QUEUE_RETURNS": "2000", "CHAOS_IMPORT_RECORDS": "10000"}  # fmt: skip

TROUBLE = {
    "store outage 2 s": {"outage": True, "outage_seconds": 2.0},
    "store outage 10 s": {"outage": True, "outage_seconds": 10.0},
    "store outage 30 s": {"outage": True, "outage_seconds": 30.0},
    "30% of store requests 503 for 10 s": {"throttle_rate": 0.3, "throttle_seconds": 10.0, "messages": 6000},
}


def trouble_configs(seed: int) -> dict[str, RunConfig]:
    messages = whole("CHAOS_TROUBLE_MESSAGES", "600")
    if messages <= 0:
        return {}
    return {name: RunConfig(**{"messages": messages, "workers": 16, "dup_rate": 0.2, "seed": seed,
                               "table": f"trouble{i}", **changes})  # type: ignore[arg-type]
            for i, (name, changes) in enumerate(TROUBLE.items())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the idempotency log is counted, not shown
    try:  # every setting read before anything runs: a bad one is the whole verdict, in one line
        config = config_from_env()
        troubles = trouble_configs(config.seed)
        sizes = {name: whole(name, default) for name, default in SIZES.items()}
        balances, accounts, kinds = balances_config()
    except ConfigurationError as exc:
        print(f"make chaos: {exc}", file=sys.stderr)
        return 2
    failed: list[str] = []

    def section(name: str, call: Callable[[], bool]) -> None:
        if not finished(name, call):
            failed.append(name)

    def on_azurite() -> bool:  # the sections that share one Azurite; one that cannot start is the verdict
        with tempfile.TemporaryDirectory(prefix="chaos-azurite-") as data, Azurite(location=Path(data)) as azurite:
            section("orders", lambda: summarise(config, run(config, azurite, ORDERS)))
            for name, trouble in troubles.items():
                print(f"\n{name}, 16 concurrent calls, no resubmission:")
                section(name, lambda trouble=trouble: summarise(trouble, run(trouble, azurite, ORDERS)))  # type: ignore[misc]
            if (chain := sizes["CHAOS_CHAIN_MESSAGES"]) > 0:
                section("outbox", lambda: summarise_chain(run_chain(ChainConfig(chain, seed=config.seed), azurite)))
            if (stream := sizes["CHAOS_STREAM_EVENTS"]) > 0:
                section(
                    "Event Hubs", lambda: summarise_stream(run_stream(StreamConfig(stream, seed=config.seed), azurite))
                )
            for n, kind in enumerate(kinds if balances.messages > 0 else []):
                entries = replace(balances, seed=config.seed, table=f"chaosbalances{n}")
                section(f"balances ({kind})", lambda kind=kind, entries=entries: summarise_balances(  # type: ignore[misc]
                    kind, run_balances(kind, entries, azurite, accounts)))  # fmt: skip
            if (orders := sizes["CHAOS_SESSION_ORDERS"]) > 0:
                sessions = SessionConfig(orders, seed=config.seed)
                section("sessions", lambda: summarise_sessions(run_sessions(sessions, azurite)))
        return True

    section("Azurite", on_azurite)
    if (returns := sizes["CHAOS_QUEUE_RETURNS"]) > 0:
        section("Storage queue", lambda: summarise_queue(run_queue(messages=returns, seed=config.seed)))
    if (records := sizes["CHAOS_IMPORT_RECORDS"]) > 0:
        section("blob import", lambda: summarise_import(blob_import.run(records=records)))
    print(f"\nmake chaos: {'FAILED: ' + ', '.join(failed) if failed else 'every section clean'} (seed {config.seed})")
    return 1 if failed else 0


def finished(name: str, section: Callable[[], bool]) -> bool:
    """Run one section: whether it finished clean. One that cannot finish (an emulator that does not
    come back, a check that cannot read) says so in a line, and the run goes on to the next."""
    try:
        return section()
    except Exception as exc:  # noqa: BLE001 - the verdict of the run, never a bare traceback
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        print(f"\nFAILED: {name} could not finish: {type(exc).__name__}: {first}")
        return False


def summarise_balances(kind: str, report: Report) -> bool:
    print(f"\nBalances ({kind}): {json.dumps(balances_summary(kind, report))}")
    return report.ok


def summarise_queue(queue: dict[str, Any]) -> bool:
    print(f"\nStorage queue: {json.dumps(queue)}")
    return not violations(queue)


def summarise_import(imported: dict[str, Any]) -> bool:
    print(f"\nBlob import: {json.dumps(imported)}")
    return not blob_import.violations(imported)


def summarise_sessions(report: SessionReport) -> bool:
    print(
        f"\nService Bus sessions: {report.messages} status changes ({report.deliveries} deliveries, "
        f"{report.session_releases} sessions released by abandons and lost locks, "
        f"{sum(report.faults.values())} store faults) in {report.seconds:.0f}s; outcomes "
        f"{dict(sorted(report.outcomes.items()))}; not at their last status {report.wrong_final}."
    )
    return report.shown()


def summarise_stream(report: StreamReport) -> bool:
    print(
        f"\nEvent Hubs: {report.logical} events ({report.sent} sent, producer retries included) in "
        f"{report.seconds:.0f}s; {report.invocations} invocations, {report.replays} batches replayed after "
        f"crashes, {report.rebalances} rebalances; {sum(report.faults.values())} store faults."
    )
    print(
        f"Parked {report.parked}, applied by the operator's replay {report.replayed_by_operator}; "
        f"double {report.double}, lost {report.lost}."
    )
    return report.shown()


def summarise_chain(report: ChainReport) -> bool:
    print(
        f"\noutbox: {report.orders} orders → order-events → billing + shipping in {report.seconds:.0f}s; "
        f"deliveries {dict(report.deliveries)}; {sum(report.faults.values())} faults injected "
        f"({', '.join(f'{k} {v}' for k, v in sorted(report.faults.items()))})."
    )
    print(
        f"Sent to the topic {report.sent_to_topic}; re-sends dropped by duplicate detection "
        f"{report.dropped_by_detection}, copies past it caught by the subscribers' dedup {report.caught_by_dedup}; "
        f"sent by the sweep {report.swept}; double {report.double}, lost {report.lost}, left unsent "
        f"{report.left_in_outbox}, in a broker's dead-letter queue {report.broker_dead_lettered}."
    )
    return report.shown()


def summarise(config: RunConfig, report: Report) -> bool:
    print(
        f"{report.messages} messages, {report.deliveries} deliveries to {config.workers} workers in "
        f"{report.seconds:.0f}s; {sum(report.faults.values())} faults injected "
        f"({', '.join(f'{k} {v}' for k, v in sorted(report.faults.items())) or 'none'}); "
        f"{report.store_restarts} store restart(s); {report.lock_expiries} lock expiries; "
        f"{report.broker_dead_lettered} left in the broker's dead-letter queue, "
        f"{report.resubmitted} resubmitted by an operator."
    )
    print(
        f"Effects applied {report.effects_applied}, dead-lettered {report.dead_lettered}, "
        f"double effects {report.double_effects}, lost {report.lost}, orphans {report.orphans}."
    )
    print(audit_line(report))
    for violation in report.violations:
        print("VIOLATION", violation)
    if not report.ok:
        print(f"FAILED: invariants violated (reproduce with CHAOS_SEED={config.seed})")
    print(json.dumps(as_json(report)))
    return report.ok


if __name__ == "__main__":
    sys.exit(main())
