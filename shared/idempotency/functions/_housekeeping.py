"""The store's housekeeping as Functions Blueprints, each registered once per app by what its
consumers need (``housekeeping``): the markers' purge always; the reconciliation of two-phase
claims for steps; the outbox's sweep for consumers that send; the canary and the audit for the
Service Bus entities the app's triggers read. They work on the app's shared store and its
consumers' senders."""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import astuple
from datetime import timedelta
from typing import Any

import azure.functions as func
from opentelemetry import metrics

from .. import audit, canary
from ..config import DEFAULT_OUTBOX_SWEEP_BUDGET, DEFAULT_PURGE_BUDGET, DEFAULT_PURGE_TIME, duration, whole
from ..consumer import IdempotentConsumer
from ..errors import ConfigurationError
from ..messages import utcnow
from ..outbox import Sender
from ..reconcile import escalate_stale_claims
from ._app import Once, _declared, declared, shared_store
from ._senders import servicebus_client

log = logging.getLogger("idempotency")
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


def housekeeping(needs: Iterable[str] = (), watched: Iterable[func.Blueprint] = ()) -> list[func.Blueprint]:
    """The timers an app registers: ``purge_markers`` and ``sweep_markers`` always (markers
    expire); ``reconcile_claims`` when a consumer makes two-phase steps (``"steps"``);
    ``dispatch_outbox`` when one sends (``"outbox"``); ``send_canaries`` and ``audit_consumers``
    when the ``watched`` Blueprints (the app's consumers) have Service Bus or Event Grid triggers."""
    wanted = set(needs)
    if wanted - NEEDS.keys():
        raise ValueError(f"housekeeping needs {sorted(wanted - NEEDS.keys())}: known are {sorted(NEEDS)}")
    watched = list(watched)
    entities = watched_entities(watched)
    audited = audited_consumers(watched)
    return [markers, *(NEEDS[name] for name in sorted(wanted)),
            *([watching(entities, audited)] if entities else [])]  # fmt: skip


EVENT_GRID = canary.Entity("eventgrid", "%EVENTGRID_TOPIC_ENDPOINT%")  # the topic the app's subscriptions are on


Audited = tuple[Once[IdempotentConsumer], audit.Peekable]  # a consumer's builder, and the entity its trigger reads


def audited_consumers(blueprints: Iterable[func.Blueprint]) -> list[Audited]:
    """What the audit reads by default: every Service Bus trigger of the Blueprints (but a session
    queue's: it is peeked session by session), with the one consumer its function hands the
    message to — the declared consumer (``@consumer``) its code names, as ``on_servicebus(invoices,
    msg)`` does (through decorators, and in its closure). Found from the declarations, without
    building anything. Not audited by default, each said in a WARNING (DEDUP_AUDIT names what it
    reads): a function that names no declared consumer, or several (a helper hands it over); a
    consumer fed by two entities (its facts mix their numbers)."""
    found: list[Audited] = []
    for blueprint in blueprints:
        for builder in blueprint._function_builders:
            function = builder._function
            for binding in function.get_bindings():
                declared_as = binding.get_dict_repr()
                if binding.type != "serviceBusTrigger" or declared_as.get("isSessionsEnabled"):
                    continue
                named = _consumers_named(function.get_user_function())
                if len(named) != 1:
                    log.warning("dedup audit: function %s reads Service Bus but names %s declared consumer: not "
                                "audited by default (DEDUP_AUDIT: consumer=entity)", function.get_function_name(),
                                "no" if not named else "more than one")  # fmt: skip
                    continue
                queue = declared_as.get("queueName")
                entity = (queue, None, None) if queue else (None, declared_as["topicName"],
                                                            declared_as["subscriptionName"])  # fmt: skip
                found.append((named[0], entity))
    fed = Counter(build for build, _ in found)
    for build in (build for build, count in fed.items() if count > 1):
        log.warning("dedup audit: consumer %s.%s reads several Service Bus entities: not audited by default (its "
                    "facts mix their numbers)", build.module, build.name)  # fmt: skip
    return [(build, entity) for build, entity in found if fed[build] == 1]


def _consumers_named(function: Any) -> list[Once[IdempotentConsumer]]:
    """The declared consumers a function refers to by name: its own globals and closure (through
    its decorators), and those of the functions nested in it."""
    try:
        bound = inspect.getclosurevars(inspect.unwrap(function))
    except TypeError:  # not Python code (a builtin)
        return []
    referred = [*bound.globals.values(), *bound.nonlocals.values()]
    return list(dict.fromkeys(value for value in referred if any(value is build for build in _declared)))


def watched_entities(blueprints: Iterable[func.Blueprint]) -> list[canary.Entity]:
    """The queues and topics the Blueprints' Service Bus triggers read, each once, and the Event
    Grid topic when they have Event Grid triggers. Read from the trigger bindings as declared
    (the list ``register_functions`` itself takes), without building the functions: building
    sets defaults on HTTP triggers, which is the app's to do."""
    found: list[canary.Entity] = []
    for blueprint in blueprints:
        for builder in blueprint._function_builders:
            for binding in builder._function.get_bindings():
                declared_as = binding.get_dict_repr()
                if binding.type == "eventGridTrigger":
                    entity = EVENT_GRID
                elif binding.type == "serviceBusTrigger":
                    entity = canary.Entity("queue" if "queueName" in declared_as else "topic",
                                           declared_as.get("queueName") or declared_as["topicName"],
                                           bool(declared_as.get("isSessionsEnabled")))  # fmt: skip
                else:
                    continue
                if entity not in found:
                    found.append(entity)
    return found


class AppCanaries:
    """Each canary with its entity's client: the app's Service Bus client (opened once a run),
    the Event Grid topic's."""

    def __init__(self) -> None:
        self._servicebus: Any = None

    def send(self, entity: canary.Entity, message_id: str, properties: dict[str, str]) -> None:
        if entity.kind == "eventgrid":
            canary.EventGridCanaries().send(entity, message_id, properties)
            return
        if self._servicebus is None:
            self._servicebus = servicebus_client("the canary timer sends")
        canary.ServiceBusCanaries(self._servicebus).send(entity, message_id, properties)

    def close(self) -> None:
        if self._servicebus is not None:
            self._servicebus.close()


def _resolved(entity: canary.Entity) -> canary.Entity:
    """``%NAME%`` read from the app setting NAME, as the host reads the trigger's."""
    if entity.name.startswith("%") and entity.name.endswith("%"):
        name = os.environ.get(entity.name.strip("%"))
        if not name:
            raise ConfigurationError(f"the canary sends to the {entity.kind} in app setting {entity.name.strip('%')}, "
                                     "which is not set")  # fmt: skip
        return entity._replace(name=name)
    return entity


def watching(entities: list[canary.Entity], audited: list[Audited] | None = None) -> func.Blueprint:
    """The canary and the audit timers of an app whose triggers read ``entities``; the audit's
    consumers by default ``audited`` (``audited_consumers``)."""
    timers = func.Blueprint()  # type: ignore[no-untyped-call]

    @timers.function_name("send_canaries")
    @timers.timer_trigger(arg_name="timer", schedule="0 */5 * * * *", use_monitor=True)
    def send_canaries(timer: func.TimerRequest) -> None:
        """Every 5 minutes (canary.INTERVAL): a canary through each Service Bus queue and topic
        the app's triggers read, and to its Event Grid topic, for the ``dedup-canary-heartbeat``
        alert."""
        resolved, unset = [], []
        for entity in entities:
            try:
                resolved.append(_resolved(entity))
            except ConfigurationError as exc:  # said each run; the other entities still get theirs
                unset.append(exc)
        sender = AppCanaries()
        try:
            canary.send(sender, resolved)
        finally:
            sender.close()
        if unset:
            raise unset[0]

    @timers.function_name("audit_consumers")
    @timers.timer_trigger(arg_name="timer", schedule="0 20 * * * *", use_monitor=True)
    def audit_consumers(timer: func.TimerRequest) -> None:
        """Hourly: the audit of each consumer the app's Service Bus triggers hand messages to,
        and DEDUP_AUDIT's overrides (``audit_now``)."""
        audit_now(os.environ.get("DEDUP_AUDIT", ""), audited or [])

    return timers


def audit_now(setting: str, derived: Iterable[Audited] = ()) -> None:
    """The audit (the audit package) of each consumer ``derived`` names (what its trigger reads,
    ``%SETTING%`` read from the app settings), with DEDUP_AUDIT's ``consumer=queue``,
    ``consumer=topic/subscription`` in place or beside, less its ``-consumer``s; each from its
    saved window on, up to 15 minutes ago; what it finds unaccounted is recorded, logged and
    counted (the ``dedup-unaccounted`` alert). Nothing when none is left."""
    wanted: dict[str, audit.Peekable | None] = {}
    for build, entity in derived:
        try:
            queue, topic, subscription = (_setting_of(name) for name in entity)
            wanted[build().name] = (queue, topic, subscription)
        except ConfigurationError as exc:  # said each run; the others are audited
            log.error("dedup audit: %s: not audited", exc)
    for name, there in audit.audited(setting):
        if there is None and name not in wanted:  # a typo would leave the one meant audited: said
            log.warning("dedup audit: DEDUP_AUDIT excludes %r, which is not audited anyway (%s)", name,
                        ", ".join(sorted(wanted)) or "none is")  # fmt: skip
        wanted[name] = there
    pairs = [(name, entity) for name, entity in wanted.items() if entity is not None]
    if not pairs:
        return
    consumers = {built.name: built for built in declared()}
    with servicebus_client("the audit peeks") as client:
        for name, entity in pairs:
            if name not in consumers:  # the example removed, its setting kept: said, the others audited
                log.error("dedup audit: DEDUP_AUDIT names consumer %r, which the app does not declare (%s): not "
                          "audited", name, ", ".join(sorted(consumers)))  # fmt: skip
                continue
            found = audit.run(consumers[name].store, name, audit.ServiceBusPeek(client, *entity), keep=True,
                              kept_for=consumers[name].retention)  # fmt: skip
            log.info("dedup audit: %s", found.line())


def _setting_of(name: str | None) -> str | None:
    """A trigger's entity name, ``%NAME%`` read from the app setting NAME, as the host reads it."""
    return None if name is None else _resolved(canary.Entity("queue", name)).name


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
    log.info("dedup purge: scanned=%d deleted=%d requests=%d", *astuple(purge))
    left = purge.deleted >= budget or time.monotonic() >= deadline
    _purges.add(1, {"budget_spent": str(left).lower()})  # true: it stopped with work left (a backlog, alert)


@markers.function_name("sweep_markers")
@markers.timer_trigger(arg_name="timer", schedule="0 0 4 * * 0", use_monitor=True)
def sweep_markers(timer: func.TimerRequest) -> None:
    """Weekly: the full scan for expired markers the index missed (an instance that died with
    notes unwritten), at most DEDUP_PURGE_BUDGET records."""
    swept = shared_store().sweep_expired(utcnow(), whole("DEDUP_PURGE_BUDGET", DEFAULT_PURGE_BUDGET))
    log.info("dedup sweep: scanned=%d deleted=%d requests=%d", *astuple(swept))


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
        log.info("dedup outbox sweep: parked=%d sent=%d failed=%d reads=%d left=%s",
                                              *astuple(swept))  # fmt: skip
        left = left or swept.left
    if stores:
        _sweeps.add(1, {"budget_spent": str(left).lower()})  # true: work left (a backlog, alert)
