"""At-least-once delivery of a message stream to a real function, by competing workers,
with optional faults and a store outage; then an invariant check that reads the real
store. Shared by `make demo` (no faults) and `make chaos` (the example's orders: their
target is in lab/demo.py) and the library's chaos tests (tests/app.py's items).

The harness drives a ``Target``: to prove your own handler, give it your function's name,
how to point its consumer at a table, a workload generator, a reader that counts, per
message key, how often its effect is in the table, and (for ``RunConfig.payments``) the
setting naming the payment API and the field of a charge holding the key.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import isodate
from azure.data.tables import TableServiceClient

from lab import runtimes, workload
from lab.cosmos_emulator import emulated
from lab.delivery_checks import dedup_settings, host_settings
from lab.infra_checks import ROOT, parameter_values
from lab.payment_service import PaymentService
from lab.runtimes import Placed
from shared.idempotency import IdempotentConsumer
from shared.idempotency.audit import account
from shared.idempotency.config import whole
from shared.idempotency.errors import ConfigurationError
from shared.idempotency.facts import CANARY_PREFIX, CANARY_PROPERTY
from shared.idempotency.keys import DedupKey, marker_id
from shared.idempotency.resend import resend
from shared.idempotency.stores import CosmosStore, DedupStore, MemoryStore, TableStore
from shared.idempotency.stores._azure import TRANSPORT, table_transactions
from shared.idempotency.stores._records import GUARD_KIND
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._transport import transaction_transport
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.broker import Lock, PeekLockQueue
from shared.idempotency.testing.delivery import deliver_until_drained
from shared.idempotency.testing.faults import FaultPlan, FaultyTransport, faulty_calls


@dataclass(frozen=True)
class Target:
    """The Service Bus queue function the harness delivers to, and what it must know of it."""

    function: str  # its name, as the host indexes it
    # (storage connection, table): point the app's settings there, as the app's settings
    # would, and return the function's consumer
    consumer: Callable[[str, str], IdempotentConsumer]
    # (count, seed, mismatch rate, invalid rate): the logical messages, e.g. workload.generate
    generate: Callable[[int, int, float, float], list[workload.LogicalMessage]]
    applied: Callable[[DedupStore], dict[str, int]]  # per message key, how often its effect is in the store
    payment_setting: str  # the app setting naming the payment API's URL (RunConfig.payments)
    charged_for: str  # the field of a charge (its request's body) that holds the message's key
    # (store, the messages in play): what else must hold of what is stored, in words (e.g. every total
    # is the sum of its entries); empty when it holds
    holds: Callable[[DedupStore, list[workload.LogicalMessage]], list[str]] = lambda store, messages: []


@dataclass(frozen=True)
class RunConfig:
    messages: int = 1000
    workers: int = 8
    dup_rate: float = 0.3
    fault_rate: float = 0.0
    seed: int = 1
    outage: bool = False
    outage_seconds: float = 1.5
    throttle_rate: float = 0.0  # this share of store requests answered 503 ...
    throttle_seconds: float = 0.0  # ... for this long from the start (the run must last longer)
    lock_duration: float = 2.0
    # None: the shipped values (infra/, host.json, the dedup defaults), scaled in time so that
    # the lock lasts ``lock_duration`` — the same proportions as on Azure.
    max_delivery_count: int | None = None
    lease: float | None = None
    in_flight_wait: float | None = None
    transient_wait: float | None = None
    # An operator's act, never automatic: rounds of resubmitting the broker's dead-letter
    # queue after the run (reported as ``resubmitted``, apart from what the consumer handled).
    resubmit_rounds: int = 0
    duplicate_window: int = 32  # MessageIds remembered by send-side duplicate detection
    mismatch_rate: float = 0.005
    invalid_rate: float = 0.01
    table: str = "records"
    payments: bool = False  # charge through a local payment API (two-phase step)
    runtime: str = "process"  # or "worker": the real Functions Python worker (store faults then stay out of reach)
    check_wait: float = 120.0  # seconds the check after the run waits for a store still coming back
    # This share of first deliveries is completed by the host without invoking the function (as
    # reported in Azure/azure-functions-host#11879): lost; the audit must name exactly these.
    settled_without_invoke: float = 0.0
    # This share of the producer's sends is scheduled (ScheduledEnqueueTimeUtc) up to
    # ``lock_duration`` ahead: numbered when sent, delivered later, seen by the audit meanwhile.
    scheduled_rate: float = 0.0
    show_log: bool = False  # the dedup log lines on the console too (lab.demo --verbose), not only counted


def rate(name: str, default: str) -> float:
    """A proportion from the environment, 0 to 1, or a ConfigurationError naming the setting."""
    value = os.environ.get(name) or default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number <= 1:
        raise ConfigurationError(f"{name}={value!r} must be a proportion from 0 to 1")
    return number


def seed_setting() -> int:
    """CHAOS_SEED, a whole number (random when unset or empty: the run prints it to reproduce)."""
    return whole("CHAOS_SEED", os.environ.get("CHAOS_SEED") or str(random.randrange(1_000_000)))


@dataclass
class Report:
    config: RunConfig
    sends: int = 0
    dropped_by_detection: int = 0
    messages: int = 0  # logical messages that reached the queue at least once
    deliveries: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    store_restarts: int = 0
    lock_expiries: int = 0
    locks_lost: int = 0
    broker_dead_lettered: int = 0  # left in the broker's DLQ (MaxDeliveryCountExceeded): a violation
    resubmitted: int = 0  # sent again by an "operator" (RunConfig.resubmit_rounds)
    effects_applied: int = 0
    double_effects: int = 0
    lost: int = 0
    dead_lettered: int = 0
    orphans: int = 0
    payment_charges: int = 0
    seconds: float = 0.0
    # settled without invoking the function (RunConfig.settled_without_invoke): sequence number, MessageId, body
    vanished: list[tuple[int, str | None, bytes]] = field(default_factory=list)
    scheduled: int = 0  # sends the queue accepted as scheduled messages
    audit: dict[str, object] = field(default_factory=dict)  # shared.idempotency.audit's account of the run
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class _OutcomeCounter(logging.Handler):
    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        fields = fields_of(record)
        counted = fields.get("outcome") or fields.get("reason")  # an outcome, or a commit contended (decided again)
        if counted:
            with self._mutex:
                self.counts[counted] += 1


@contextmanager
def _counting_outcomes(counts: Counter[str], *, shown: bool = False) -> Iterator[None]:
    logger = logging.getLogger("idempotency")
    handler = _OutcomeCounter(counts)
    logger.addHandler(handler)
    previous, logger.propagate = logger.propagate, shown  # unless shown, the console keeps to the summary
    level = logger.level
    logger.setLevel(logging.DEBUG)  # every outcome, the everyday ones included
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = previous
        logger.setLevel(level)


def run(config: RunConfig, azurite: Azurite, target: Target, *, break_store: type[TableStore] | None = None) -> Report:
    """``break_store`` swaps in a deliberately broken store class, so that tests can show
    the invariant checker catching what it claims to catch."""
    report = Report(config)
    started, started_at = time.monotonic(), datetime.now(UTC)
    logical = target.generate(config.messages, config.seed, config.mismatch_rate, config.invalid_rate)
    timing = Timing.of(config)
    queue = PeekLockQueue(config.lock_duration, timing.max_deliveries, config.duplicate_window, timing.lock_renewal)
    accepted: set[int] = set()
    later = random.Random(f"{config.seed}/scheduled")
    for index, body in workload.sends(logical, config.dup_rate, config.seed):
        scheduled_in = later.uniform(0, config.lock_duration) if later.random() < config.scheduled_rate else 0.0
        if queue.send(logical[index].message_id, body, scheduled_in=scheduled_in):
            accepted.add(index)
            report.scheduled += scheduled_in > 0
    report.messages = len(accepted)

    plan = FaultPlan(config.fault_rate, config.seed, config.lock_duration)
    plan.settled_without_invoke = config.settled_without_invoke
    running = threading.local()  # each worker's current lock, for the faults that take it away

    def lose_lock() -> None:  # the running delivery's (a store call outside a delivery holds none)
        if hasattr(running, "lock"):
            queue.lose(running.lock)

    plan.lose_lock = lose_lock
    with ExitStack() as stack:
        payments = stack.enter_context(PaymentService(hook=_payment_faults(plan))) if config.payments else None
        if payments is not None:  # stopped with the run, whichever way it ends: nothing may call it any more
            stack.callback(os.environ.pop, target.payment_setting, None)
        _configure(timing, payments, target.payment_setting)
        consumer = target.consumer(azurite.connection_string, config.table)
        if isinstance(consumer.store, CosmosStore):  # faults are injected on the Table transport only
            store: DedupStore = emulated_view(consumer.store)
        elif isinstance(consumer.store, MemoryStore):  # faults around its calls; the checker reads it as is
            store = consumer.store
            if config.fault_rate > 0 or config.throttle_rate > 0:
                faulty_calls(store, plan)
        else:
            faulty = (config.fault_rate > 0 or config.throttle_rate > 0) and config.runtime == "process"
            store = _attach_store(consumer, azurite, plan, faulty, break_store or TableStore)
        runtime = stack.enter_context(runtimes.started(config.runtime))

        def deliver(lock: Lock) -> None:
            running.lock = lock
            message = lock.message
            runtime.servicebus(target.function, message.body, message.message_id, lock.delivery_count,
                               Placed(message.seq, message.enqueued_at, message.properties))  # fmt: skip

        def resubmit() -> int:  # the operator's act, with the template's tool (its records on the clean store)
            return len(resend(store, consumer.name, queue.dead_letter_queue(), len(queue.dead)))

        _deliver_all(config, azurite, queue, deliver, plan, report, resubmit)
        report.sends, report.dropped_by_detection = queue.sent, queue.dropped_by_detection  # the canary apart
        report.deliveries, report.lock_expiries, report.locks_lost = (
            queue.deliveries,
            queue.lock_expiries,
            queue.locks_lost,
        )
        if not azurite.listening(config.check_wait):  # what is stored cannot be read: the verdict says so
            report.violations.append(f"the store did not answer within {config.check_wait:g} s after the run: "
                                     "nothing could be checked")  # fmt: skip
            report.seconds = time.monotonic() - started
            return report
        _close_with_a_canary(config, queue, deliver)
        applied = target.applied(store)
        if payments is not None:  # one accepted charge per message, and one effect
            charges = payments.charges_per(target.charged_for)
            report.payment_charges = sum(charges.values())
            applied = {key: max(applied.get(key, 0), charges.get(key, 0)) for key in applied.keys() | charges.keys()}

    report.faults, report.vanished = plan.injected, plan.vanished
    in_play = [logical[i] for i in sorted(accepted)]
    _verify(report, in_play, store, consumer.name, applied, queue)
    _audit(report, store, consumer.name, queue, started_at)
    report.violations += target.holds(store, in_play)
    report.seconds = time.monotonic() - started
    return report


Deliver = Callable[[Lock], None]


def _deliver_all(config: RunConfig, azurite: Azurite, queue: PeekLockQueue, deliver: Deliver, plan: FaultPlan,
                 report: Report, resubmit: Callable[[], int]) -> None:  # fmt: skip
    with _counting_outcomes(report.outcomes, shown=config.show_log):
        trouble = _start_trouble(config, azurite, queue, plan, report)
        deliver_until_drained(queue, deliver, plan, config.workers)
        trouble.join()
        for _ in range(config.resubmit_rounds):  # only when a test asks for an operator's help
            if not queue.dead:
                break
            report.resubmitted += resubmit()
            deliver_until_drained(queue, deliver, plan, config.workers)


@dataclass(frozen=True)
class Timing:
    max_deliveries: int
    lease: float
    in_flight_wait: float
    transient_wait: float
    lock_renewal: float

    @staticmethod
    def of(config: RunConfig) -> Timing:
        """The run's timing: what the config sets, the rest as shipped (the Service Bus
        queues' lock duration and delivery count in infra/main.bicep, host.json, the dedup
        defaults), scaled to its lock."""
        infra = parameter_values(ROOT / "infra")
        lock = isodate.parse_duration(infra["lockDuration"])
        dedup, host = dedup_settings(), host_settings(json.loads((ROOT / "host.json").read_text()))
        scale = config.lock_duration / lock.total_seconds()

        def scaled(value: timedelta, given: float | None) -> float:
            return value.total_seconds() * scale if given is None else given

        return Timing(
            config.max_delivery_count or int(infra["maxDeliveryCount"]),
            scaled(dedup.lease, config.lease),
            scaled(dedup.in_flight_wait, config.in_flight_wait),
            scaled(dedup.transient_wait, config.transient_wait),
            scaled(host.lock_renewal, None),
        )


def _configure(timing: Timing, payments: PaymentService | None, payment_setting: str | None = None) -> None:
    """The app's settings for the run, as infra sets them, scaled; ``payment_setting``, the
    target's, points at ``payments`` (or is removed)."""
    os.environ.update(
        DEDUP_LEASE=f"PT{timing.lease:.3f}S",
        DEDUP_IN_FLIGHT_WAIT=f"PT{timing.in_flight_wait:.3f}S",
        DEDUP_TRANSIENT_WAIT=f"PT{timing.transient_wait:.3f}S",
        DEDUP_MAX_DELIVERY_COUNT=str(timing.max_deliveries),
    )
    if payment_setting is None:
        return
    if payments is None:
        os.environ.pop(payment_setting, None)
    else:
        os.environ[payment_setting] = payments.url


def _payment_faults(plan: FaultPlan) -> Callable[[str, str], str | None]:
    """The payment API fails before charging (503) or charges and loses its answer."""

    def hook(key: str, phase: str) -> str | None:
        if phase == "before":
            return "fail" if plan.draw(("payment_503",)) else None
        return "drop" if plan.draw(("payment_response_lost",)) else None

    return hook


def emulated_view(store: CosmosStore) -> CosmosStore:
    """The checker reads through the emulator adapter (lab/cosmos_emulator.py)."""
    return CosmosStore(emulated(store.container), emulated(store.dead_letter_container), store.partition_field,
                       dead_letter_retention=store.dead_letter_retention)  # fmt: skip


def _attach_store(
    consumer: IdempotentConsumer, azurite: Azurite, plan: FaultPlan, faulty: bool, store_class: type[TableStore]
) -> TableStore:
    """With faults, give the consumer's store a faulty transport (the function and the
    flow stay untouched). Returns a clean store on the same tables for the checker."""
    assert isinstance(consumer.store, TableStore)
    table, dead = consumer.store.table.table_name, consumer.store.dead_letter_table
    transport = {"transport": FaultyTransport(plan)} if faulty else {}
    service = TableServiceClient.from_connection_string(azurite.connection_string, **transport, **TRANSPORT)
    # the lean path's faults are injected in front of its own transport (urllib3)
    faulty_lean = {"transport": FaultyTransport(plan, transaction_transport())} if faulty else {}
    lean = TableTransactions.of(service, table, **faulty_lean, **TRANSPORT) if table_transactions() == "lean" else None
    consumer.store = store_class(service, table, dead, transactions=lean)
    clean = TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT)
    return TableStore(clean, table, dead)


def _close_with_a_canary(config: RunConfig, queue: PeekLockQueue, deliver: Deliver) -> None:
    """What the app's canary timer does every few minutes: a message after the run's last, so
    that the audit's window closes on it (a loss at the very end is a gap before it). Delivered
    without faults: one lost would leave the tail to the next canary, which a run does not have."""
    queue.send(f"{CANARY_PREFIX}{config.seed}", b"{}", {CANARY_PROPERTY: "harness"})
    deliver_until_drained(queue, deliver, FaultPlan(0.0, config.seed, config.lock_duration), config.workers)


def _audit(report: Report, store: DedupStore, scope: str, queue: PeekLockQueue, started_at: datetime) -> None:
    """Account for every sequence number the queue gave, from what the consumer stored and what
    the queue still holds: the messages lost on the way (``settled_without_invoke``) and no
    other are unaccounted, and the identity closes on the rest."""
    found = account(store, scope, queue, after=0, since=started_at - timedelta(minutes=1),
                    until=datetime.now(UTC) + timedelta(minutes=1))  # fmt: skip
    report.audit = found.summary()
    unaccounted = sorted(gap.sequence for gap in found.unaccounted)
    expected = sorted(seq for seq, _, _ in report.vanished)
    if unaccounted != expected:
        report.violations.append(f"the audit's unaccounted {unaccounted[:20]} are not the messages lost on the way "
                                 f"{expected[:20]}")  # fmt: skip
    if found.received != queue.accepted or found.canaries != 1:
        report.violations.append(f"the audit received {found.received} with {found.canaries} canary; the queue "
                                 f"accepted {queue.accepted} (1 canary)")  # fmt: skip


def _start_trouble(
    config: RunConfig, azurite: Azurite, queue: PeekLockQueue, plan: FaultPlan, report: Report
) -> threading.Thread:
    """Answer a share of store requests 503 from the start for a while (throttling), and/or,
    once 40% of the queue is done, stop the store, keep it down, bring it back (an outage)."""
    if config.throttle_rate:
        plan.throttle(config.throttle_rate, config.throttle_seconds)

    def trouble() -> None:
        if not config.outage:
            return
        while queue.completed < 0.4 * queue.sent - queue.dropped_by_detection and not queue.drained():
            time.sleep(0.01)
        problem = azurite.outage(config.outage_seconds)
        if problem is None:
            report.store_restarts += 1
        else:
            report.violations.append(problem)

    thread = threading.Thread(target=trouble, name="trouble")
    thread.start()
    return thread


def _verify(
    report: Report,
    in_play: list[workload.LogicalMessage],
    store: DedupStore,
    scope: str,
    applied: dict[str, int],
    queue: PeekLockQueue,
) -> None:
    """Read the real store: every logical message has its effect exactly once or a
    dead-letter record with its reason; no marker without effects, nor the reverse."""
    dead = store.dead_letters(scope)
    in_broker_dlq = {(m.message_id, m.body) for m in queue.dead}
    # never reached the function (RunConfig.settled_without_invoke): lost before the consumer, and
    # the audit's to name (_audit); a copy of them that did reach it must be handled as ever
    vanished = {(message_id, body) for _, message_id, body in report.vanished}
    report.broker_dead_lettered = len(queue.dead)
    variants: dict[str, list[workload.LogicalMessage]] = defaultdict(list)
    for message in in_play:
        if message.key is not None:
            variants[message.key].append(message)

    def violation(kind: str, key: object) -> None:
        if len(report.violations) < 50:
            report.violations.append(f"{kind}: {key!r}")

    # Copies of one key with different payloads: one is applied, the others refused.
    mismatches = Counter(d.key_id for d in dead if d.reason == "fingerprint_mismatch")
    for key, group in variants.items():
        times = applied.get(key, 0)
        if times > 1:
            report.double_effects += times - 1
            violation("double effect", key)
        if times == 1:
            report.effects_applied += 1
        parked = sum((m.message_id, m.body) in in_broker_dlq or (m.message_id, m.body) in vanished for m in group)
        expected_refusals = len(group) - 1 if times else 0
        if (times == 0 and parked < len(group)) or mismatches[key] + parked < expected_refusals:
            report.lost += 1
            violation("lost", key)
        refused = [d for d in dead if d.key_id == key]
        if times and len({d.fingerprint for d in refused}) > len(group) - 1:  # a copy both applied and refused
            violation("applied and dead-lettered", [(d.message_id, d.reason, d.delivery_count, d.detail[:200])
                                                    for d in refused])  # fmt: skip
    records = {(d.message_id, d.body, d.reason) for d in dead}
    for message in in_play:
        if message.invalid_reason is None:
            continue
        recorded = (message.message_id, message.body, message.invalid_reason) in records
        if not recorded and (message.message_id, message.body) not in in_broker_dlq | vanished:
            report.lost += 1
            violation("invalid message without its dead-letter record", message.message_id)
    # One per refused logical message: a producer's retry may re-serialise a body (other bytes,
    # the same payload), and each body is recorded as it came.
    report.dead_lettered = len({(d.key_id or d.message_id, d.reason, d.fingerprint or d.body) for d in dead})
    for parked_message in queue.dead:  # the consumer gave up on it: only an operator can bring it back
        violation(
            "left in the broker's dead-letter queue", f"{parked_message.message_id} ({parked_message.dead_reason})"
        )
    for problem in orphans(store, scope, applied):
        report.orphans += 1
        violation("orphan", problem)


def audit_line(report: Report) -> str:
    """The accounting identity of the run, from the audit of what the consumer stored and the queue holds."""
    a = report.audit
    if not a:
        return "Audit: not run."
    return (f"Audit: received {a['received']} = processed {a['processed']} (canaries {a['canaries']}) + duplicates "
            f"{a['duplicates']} + refused {a['refused']} + dead-lettered {a['dead_lettered']} + in flight "
            f"{a['in_flight']} + unaccounted {a['unaccounted']}; settled without invoking the function "
            f"{len(report.vanished)}.")  # fmt: skip


def orphans(store: DedupStore, scope: str, applied: dict[str, int]) -> list[str]:
    """Half-written state: a marker without its effects, effects without their marker, a
    fingerprint guard without its marker."""
    markers: dict[str, str] = {}
    guards: set[str] = set()
    library: set[str] = set()  # markers of the consumer's own scopes (scope|…: pins, canaries, duplicates' records)
    for item in store.scan():
        if item.key is not None and not item.key.step and item.key.scope == scope:
            markers[marker_id(item.key)] = item.key.id  # by key: a Cosmos document may be its own marker
        elif item.key is not None and item.key.scope.startswith(scope + "|"):
            library.add(marker_id(item.key))
        elif item.kind == GUARD_KIND:
            guards.add(item.name.rsplit("|", 1)[0])
    found = [f"marker without effects: {key_id}" for key_id in markers.values() if not applied.get(key_id)]
    found += [f"effects without marker: {key}" for key in applied if marker_id(DedupKey(scope, key)) not in markers]
    found += [f"guard without marker: {row}" for row in guards - markers.keys() - library]
    return found
