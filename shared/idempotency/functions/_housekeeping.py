"""The store's housekeeping as Functions Blueprints, each registered once per app by what its
consumers need (``housekeeping``): the markers' purge always; the reconciliation of two-phase
claims for steps; the outbox's sweep for consumers that send. They work on the app's shared
store and its consumers' senders."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import astuple
from datetime import timedelta

import azure.functions as func
from opentelemetry import metrics

from ..config import DEFAULT_OUTBOX_SWEEP_BUDGET, DEFAULT_PURGE_BUDGET, DEFAULT_PURGE_TIME, duration, whole
from ..consumer import IdempotentConsumer
from ..messages import utcnow
from ..outbox import Sender
from ..reconcile import escalate_stale_claims
from ._app import declared, shared_store

_purges = metrics.get_meter("idempotency").create_counter(
    "dedup.purge.runs", description="Purge runs, by whether they spent their whole budget (a backlog)"
)
_sweeps = metrics.get_meter("idempotency").create_counter(
    "dedup.outbox.sweep.runs", description="Outbox sweeps, by whether they stopped with due keys left (a backlog)"
)
markers = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
claims = func.Blueprint()  # type: ignore[no-untyped-call]
outbox = func.Blueprint()  # type: ignore[no-untyped-call]
NEEDS = {"steps": claims, "outbox": outbox}


def housekeeping(needs: Iterable[str] = ()) -> list[func.Blueprint]:
    """The timers an app registers: ``purge_markers`` and ``sweep_markers`` always (markers
    expire); ``reconcile_claims`` when a consumer makes two-phase steps (``"steps"``);
    ``dispatch_outbox`` when one sends (``"outbox"``)."""
    wanted = set(needs)
    if wanted - NEEDS.keys():
        raise ValueError(f"housekeeping needs {sorted(wanted - NEEDS.keys())}: known are {sorted(NEEDS)}")
    return [markers, *(NEEDS[name] for name in sorted(wanted))]


@claims.function_name("reconcile_claims")
@claims.timer_trigger(arg_name="timer", schedule="0 */15 * * * *", use_monitor=True)
def reconcile_claims(timer: func.TimerRequest) -> None:
    """Escalates two-phase claims whose lease expired more than DEDUP_STALE_AFTER ago."""
    escalate_stale_claims(shared_store(), duration("DEDUP_STALE_AFTER", "PT1H"))


@markers.function_name("purge_markers")
@markers.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", use_monitor=True)
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


@markers.function_name("sweep_markers")
@markers.timer_trigger(arg_name="timer", schedule="0 0 4 * * 0", use_monitor=True)
def sweep_markers(timer: func.TimerRequest) -> None:
    """Weekly: the full scan for expired markers the index missed (an instance that died with
    notes unwritten), at most DEDUP_PURGE_BUDGET records."""
    swept = shared_store().sweep_expired(utcnow(), whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET))
    logging.getLogger("idempotency").info("dedup sweep: scanned=%d deleted=%d requests=%d", *astuple(swept))


FIRST_SWEEP = timedelta(days=2)  # how far back a sweep without a cursor reads: 48 hourly reads, once


@outbox.function_name("dispatch_outbox")
@outbox.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", use_monitor=True)
def dispatch_outbox(timer: func.TimerRequest) -> None:
    """Sends what parked deliveries (HTTP calls, last deliveries) left unsent, each with its
    consumer's own sender: reads only the hours since its cursor, for at most DEDUP_PURGE_TIME
    and DEDUP_OUTBOX_SWEEP_BUDGET keys. Nothing to do while no consumer sends."""
    sending = [built for built in declared() if built.sender is not None]
    # Every sender to every store's sweep: consumers on separate store objects may share a table.
    senders: dict[str, Sender] = {built.name: built.sender for built in sending if built.sender is not None}
    stores: dict[int, IdempotentConsumer] = {}  # one sweep per store, with its first consumer's delay
    for built in sending:
        stores.setdefault(id(built.store), built)
    budget = whole("DEDUP_OUTBOX_SWEEP_BUDGET", DEFAULT_OUTBOX_SWEEP_BUDGET)
    deadline = time.monotonic() + duration("DEDUP_PURGE_TIME", DEFAULT_PURGE_TIME).total_seconds()
    left = False
    for first in stores.values():
        swept = first.outbox(senders[first.name]).sweep(utcnow(), since=FIRST_SWEEP, budget=budget,
                                                        deadline=deadline, senders=senders)  # fmt: skip
        logging.getLogger("idempotency").info("dedup outbox sweep: parked=%d sent=%d failed=%d reads=%d left=%s",
                                              *astuple(swept))  # fmt: skip
        left = left or swept.left
    if stores:
        _sweeps.add(1, {"budget_spent": str(left).lower()})  # true: work left (a backlog, alert)
