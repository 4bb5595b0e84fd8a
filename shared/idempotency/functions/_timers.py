"""The store's housekeeping as a Functions Blueprint: register it once per app
(``app.register_functions(timers)``); it works on the app's shared store (and sender)."""

from __future__ import annotations

import logging
import time
from dataclasses import astuple
from datetime import timedelta

import azure.functions as func
from opentelemetry import metrics

from ..config import DEFAULT_PURGE_BUDGET, DEFAULT_PURGE_TIME, duration, whole
from ..messages import utcnow
from ..reconcile import escalate_stale_claims
from ._registry import declared, shared_sender, shared_store

_purges = metrics.get_meter("idempotency").create_counter(
    "dedup.purge.runs", description="Purge runs, by whether they spent their whole budget (a backlog)"
)
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@bp.function_name("reconcile_claims")
@bp.timer_trigger(arg_name="timer", schedule="0 */15 * * * *", use_monitor=True)
def reconcile_claims(timer: func.TimerRequest) -> None:
    """Escalates two-phase claims whose lease expired more than DEDUP_STALE_AFTER ago."""
    escalate_stale_claims(shared_store(), duration("DEDUP_STALE_AFTER", "PT1H"))


@bp.function_name("purge_markers")
@bp.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", use_monitor=True)
def purge_markers(timer: func.TimerRequest) -> None:
    """Table Storage has no TTL: delete the markers that expired, following the expiry index,
    for at most DEDUP_PURGE_TIME of a run (under functionTimeout), DEDUP_PURGE_BUDGET records."""
    budget = whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET)
    deadline = time.monotonic() + duration("DEDUP_PURGE_TIME", DEFAULT_PURGE_TIME).total_seconds()
    try:
        purge = shared_store().purge_expired(utcnow(), budget, deadline=deadline)
    except Exception:
        _purges.add(1, {"budget_spent": "true"})  # a run that failed left its work: the backlog alert counts it
        raise
    logging.getLogger("idempotency").info("dedup purge: scanned=%d deleted=%d requests=%d", *astuple(purge))
    left = purge.deleted >= budget or time.monotonic() >= deadline
    _purges.add(1, {"budget_spent": str(left).lower()})  # true: it stopped with work left (a backlog, alert)


@bp.function_name("sweep_markers")
@bp.timer_trigger(arg_name="timer", schedule="0 0 4 * * 0", use_monitor=True)
def sweep_markers(timer: func.TimerRequest) -> None:
    """Weekly: the full scan for expired markers the index missed (an instance that died with
    notes unwritten), at most DEDUP_PURGE_BUDGET records."""
    swept = shared_store().sweep_expired(utcnow(), whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET))
    logging.getLogger("idempotency").info("dedup sweep: scanned=%d deleted=%d requests=%d", *astuple(swept))


FIRST_SWEEP = timedelta(days=2)  # how far back a sweep without a cursor reads: 48 hourly reads, once


@bp.function_name("dispatch_outbox")
@bp.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", use_monitor=True)
def dispatch_outbox(timer: func.TimerRequest) -> None:
    """Sends what parked deliveries (HTTP calls, last deliveries) left unsent: reads only the
    hours since its cursor. Nothing to do, and no sender built, while no consumer sends."""
    senders = [c for c in declared() if c.sender is not None]
    if not senders:
        return
    swept = senders[0].outbox(shared_sender()).sweep(utcnow(), since=FIRST_SWEEP)
    logging.getLogger("idempotency").info("dedup outbox sweep: parked=%d sent=%d failed=%d reads=%d", *astuple(swept))
