"""`make chaos`: the `orders` function under at-least-once delivery, competing workers,
injected faults and a store outage; exits non-zero on any violated invariant.

Knobs (environment): CHAOS_MESSAGES (5000), CHAOS_WORKERS (8), CHAOS_DUP_RATE (0.3),
CHAOS_FAULT_RATE (0.05), CHAOS_SEED (random when unset), CHAOS_OUTAGE (1),
CHAOS_PAYMENTS (0; 1 = charge through a local payment API, a two-phase step), CHAOS_RUNTIME
(process; worker = deliver through the real Functions Python worker: store faults then cannot
be injected inside it, delivery faults and the outage still are).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
from pathlib import Path

from tools.azurite import Azurite
from tools.harness import Report, RunConfig, run


def config_from_env() -> RunConfig:
    env = os.environ.get
    return RunConfig(
        messages=int(env("CHAOS_MESSAGES", "5000")),
        workers=int(env("CHAOS_WORKERS", "8")),
        dup_rate=float(env("CHAOS_DUP_RATE", "0.3")),
        fault_rate=float(env("CHAOS_FAULT_RATE", "0.05")),
        seed=int(env("CHAOS_SEED") or random.randrange(1_000_000)),
        outage=env("CHAOS_OUTAGE", "1") == "1",
        payments=env("CHAOS_PAYMENTS", "0") == "1",
        table="chaosorders",
        runtime=env("CHAOS_RUNTIME", "process"),
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
        "outcomes": dict(sorted(report.outcomes.items())),
        "lock_expiries": report.lock_expiries,
        "locks_lost": report.locks_lost,
        "broker_dead_lettered": report.broker_dead_lettered,
        "resubmitted_by_an_operator": report.resubmitted,
        "seconds": round(report.seconds, 1),
        "runtime": report.config.runtime,
    }


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the idempotency log is counted, not shown
    config = config_from_env()
    with tempfile.TemporaryDirectory(prefix="chaos-azurite-") as data, Azurite(location=Path(data)) as azurite:
        report = run(config, azurite)
    print(
        f"{report.messages} messages, {report.deliveries} deliveries to {config.workers} workers in "
        f"{report.seconds:.0f}s; {sum(report.faults.values())} faults injected "
        f"({', '.join(f'{k} {v}' for k, v in sorted(report.faults.items())) or 'none'}); "
        f"{report.store_restarts} store restart(s); {report.lock_expiries} lock expiries; "
        f"{report.resubmitted} resubmitted from the dead-letter queue."
    )
    print(
        f"Effects applied {report.effects_applied}, dead-lettered {report.dead_lettered}, "
        f"double effects {report.double_effects}, lost {report.lost}, orphans {report.orphans}."
    )
    for violation in report.violations:
        print("VIOLATION", violation)
    if not report.ok:
        print(f"FAILED: invariants violated (reproduce with CHAOS_SEED={config.seed})")
    print(json.dumps(as_json(report)))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
