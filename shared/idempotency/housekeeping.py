"""The store's housekeeping by hand: what the timers do (``purge_markers``, ``sweep_markers``,
``dispatch_outbox``), run once now, with what it did and what it left printed.

    python -m shared.idempotency.housekeeping purge [--budget N]
    python -m shared.idempotency.housekeeping sweep [--budget N]
    python -m shared.idempotency.housekeeping outbox [--budget N]

``purge``: the markers and dead-letter records that expired, by the expiry index, for at most
DEDUP_PURGE_TIME; ``sweep``: the full scan for what the index missed; ``outbox``: the messages
parked deliveries left unsent, each with its consumer's sender (``--consumers``). One JSON line:
what was read, deleted or sent, and ``left`` — true when it stopped with work left (a backlog:
run it again, or see why). Exit 2 when it cannot run (settings, a table, the store).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from .commands import command, one_line_errors, read_settings
from .config import DEFAULT_OUTBOX_SWEEP_BUDGET, DEFAULT_PURGE_BUDGET, DEFAULT_PURGE_TIME, duration, whole
from .messages import utcnow


def main(argv: list[str] | None = None) -> int:
    parser = command("shared.idempotency.housekeeping", __doc__)
    parser.add_argument("task", choices=["purge", "sweep", "outbox"], help="what to run once")
    parser.add_argument("--budget", type=int, help="records (outbox: parked keys) at most; default: the timer's")
    parser.add_argument("--consumers", default="consumers", help="outbox: the module that declares the consumers")
    args = parser.parse_args(argv)
    with one_line_errors(f"housekeeping {args.task}"):
        read_settings(args.settings)
        done = _outbox(args.consumers, args.budget) if args.task == "outbox" else _markers(args.task, args.budget)
    print(json.dumps(done))
    return 0


def _markers(task: str, budget: int | None) -> dict[str, object]:
    from .stores import app_store

    store = app_store(create=False)
    store.check_tables()
    budget = budget or whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET)
    deadline = time.monotonic() + duration("DEDUP_PURGE_TIME", DEFAULT_PURGE_TIME).total_seconds()
    if task == "purge":
        done = store.purge_expired(utcnow(), budget, deadline=deadline)
        return {**asdict(done), "left": done.deleted >= budget or time.monotonic() >= deadline}
    done = store.sweep_expired(utcnow(), budget)
    return {**asdict(done), "left": done.deleted >= budget}


def _outbox(consumers: str, budget: int | None) -> dict[str, object]:
    from .functions._app import declared, using_store
    from .functions._housekeeping import FIRST_SWEEP
    from .stores import app_store

    store = app_store(create=False)
    store.check_tables()
    with using_store(store):
        sending = [built for built in declared(consumers) if built.sender is not None]
    if not sending:
        return {"parked": 0, "sent": 0, "failed": 0, "reads": 0, "left": False, "senders": 0}
    senders = {built.name: built.sender for built in sending if built.sender is not None}
    budget = budget or whole("DEDUP_OUTBOX_SWEEP_BUDGET", DEFAULT_OUTBOX_SWEEP_BUDGET)
    deadline = time.monotonic() + duration("DEDUP_PURGE_TIME", DEFAULT_PURGE_TIME).total_seconds()
    first = sending[0]
    swept = first.outbox(senders[first.name]).sweep(utcnow(), since=FIRST_SWEEP, budget=budget, deadline=deadline,
                                                    senders=senders)  # fmt: skip
    return {**asdict(swept), "senders": len(senders)}


if __name__ == "__main__":
    sys.exit(main())
