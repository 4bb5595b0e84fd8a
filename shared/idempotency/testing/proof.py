"""Prove a consumer of your app exactly once in effect, in one call of your test:

    verdict = prove(on_invoice, [Message({"invoiceId": f"inv-{i}", "amount": i}, f"inv-{i}") for i in range(200)])
    assert verdict.ok, verdict

The kit sends the workload as a producer does (retries with the body re-serialised, twins: the
same MessageId with another body, invalid messages), delivers it to the function as its broker
does (Service Bus peek-lock: competing receivers, abandon redelivers at once, locks that lapse or
are lost while a second receiver takes the message, completions lost after success, max delivery
count → dead-letter queue, duplicate detection over a window), with seeded faults (a crash before
the handler, before and after the commit, before settlement; store requests answered 503, applied
with their answer lost; an outage), then checks what is stored: every valid message decided
exactly once, none lost, nothing left in the broker's dead-letter queue, every invalid message
recorded once with its reason, twins refused, outcomes exact, the audit's identity closed — and
your invariant. docs/testing.md says what is modelled and what is kinder than Azure."""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import isodate

from ..audit import account
from ..config import DedupConfig
from ..errors import StoreUnavailable
from ..facts import CANARY_PREFIX, CANARY_PROPERTY
from ..keys import DedupKey
from ..payload import fingerprint
from ..stores import DedupStore, MemoryStore, TableStore
from ..stores._records import Marker, State
from ..telemetry import fields_of
from ._read_back import entities
from .azurite import Azurite
from .broker import Lock, PeekLockQueue
from .faults import WORKER_FAULTS, Crash, FaultPlan, FaultyTransport, faulty_calls

STORES = ("memory", "table-lean", "table-sdk")
DECISIONS = {"processed": "applied", "declined": "declined", "invalid": "refused as invalid"}
SETTLED = frozenset({"processed", "duplicate", "declined", "invalid", "conflict", "stale"})


@dataclass(frozen=True)
class Message:
    """One logical message as its producer sends it: ``body`` a JSON value (sent as its JSON) or
    bytes (sent as they are), ``message_id`` its MessageId (an event's id), ``invalid`` the reason
    its consumer must refuse it with (e.g. ``"schema_violation"``), if it must."""

    body: Any
    message_id: str | None = None
    invalid: str | None = None
    # Service Bus: application properties; Event Grid: the CloudEvent's source, type and subject
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def raw(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


@dataclass(frozen=True)
class Accepted:
    """A message its consumer decided: ``decision`` is ``"applied"`` or ``"declined"``."""

    key: str
    message_id: str | None
    payload: Any
    decision: str


class Stored:
    """What is stored, for an invariant: ``entities(name, partition)`` (markers left out) and the store."""

    def __init__(self, store: DedupStore) -> None:
        self.store = store

    def entities(self, name: str | None = None, partition: str | None = None) -> list[dict[str, Any]]:
        return entities(self.store, name, partition)


Invariant = Callable[[list[Accepted], Stored], list[str]]
Workload = Sequence[Message] | Callable[[random.Random, int], Iterable[Message]]


@dataclass(frozen=True)
class Faults:
    """Each a share, drawn from the run's seed: ``rate`` of store requests and settlements meet a
    fault (503, timeout, the answer lost once applied, a crash around the commit, the lock lost
    mid-commit; a crash before the handler, a completion lost); the producer sends ``duplicates``
    of its messages again (some re-serialised), ``twins`` again under the same MessageId with
    another message's body, and ``invalid`` messages of its own (not JSON); ``outage`` seconds
    with the store down once 40 % of the queue is done (a Table store: its Azurite restarted)."""

    rate: float = 0.05
    duplicates: float = 0.3
    twins: float = 0.02
    invalid: float = 0.02
    outage: float = 0.0

    @staticmethod
    def none() -> Faults:
        return Faults(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Broker:
    """The queue as deployed: lock duration, max delivery count, the host's lock renewal
    (host.json ``maxAutoLockRenewalDuration``), and how many MessageIds duplicate detection
    remembers (the service keeps a time window: here the last ``duplicate_window`` sends)."""

    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    lock_renewal: timedelta = timedelta(minutes=5)
    duplicate_window: int = 32

    @staticmethod
    def of_app() -> Broker:
        """The app's own: host.json's lock renewal; infra/main.bicep's lockDuration and
        maxDeliveryCount when the template's infra reader is there (lab/infra_checks.py), else
        Service Bus's defaults."""
        from ..functions._host import host_setting, timespan  # host.json, beside shared/

        renewal = timespan(host_setting("extensions", "serviceBus", "maxAutoLockRenewalDuration"))
        broker = Broker() if renewal is None else Broker(lock_renewal=renewal)
        try:
            from lab.infra_checks import ROOT, parameter_values
        except ImportError:
            return broker
        infra = parameter_values(ROOT / "infra")
        lock, count = infra.get("lockDuration"), infra.get("maxDeliveryCount")
        return replace(broker, lock_duration=isodate.parse_duration(lock) if lock else broker.lock_duration,
                       max_delivery_count=int(count) if count else broker.max_delivery_count)  # fmt: skip


@dataclass
class Verdict:
    seed: int
    store: str
    messages: int = 0  # logical messages sent
    sends: int = 0
    dropped_by_detection: int = 0
    deliveries: int = 0
    decided: Counter[str] = field(default_factory=Counter)  # applied, declined, refused (twins), invalid
    outcomes: Counter[str] = field(default_factory=Counter)  # as the consumer reported each delivery
    faults: Counter[str] = field(default_factory=Counter)
    broker_dead_lettered: int = 0
    resubmitted: int = 0  # by an operator: the kit never does
    audit: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        """The verdict as one JSON line."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "violations"}
        return json.dumps({"ok": self.ok, **_plain(counts), "violations": self.violations[:20]}, default=str)

    def __str__(self) -> str:
        head = (f"{'PROVEN' if self.ok else 'VIOLATED'} on {self.store}, seed {self.seed}: {self.messages} messages, "
                f"{self.sends} sends, {self.deliveries} deliveries; decided {dict(self.decided)}; faults "
                f"{sum(self.faults.values())}; left in the broker's DLQ {self.broker_dead_lettered}")  # fmt: skip
        shown = "".join(f"\n  - {v}" for v in self.violations[:10])
        more = f"\n  … and {len(self.violations) - 10} more" if len(self.violations) > 10 else ""
        again = f"\n  reproduce: the same call with seed={self.seed}" if self.violations else ""
        return head + shown + more + again


def _plain(value: Any) -> Any:
    """JSON's shapes: mappings with text keys (an audit's are not all text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Proof:
    """A consumer's proof, to run in a test (``run``) or bigger (``make prove PROOF=MODULE:NAME``,
    ``python -m shared.idempotency.testing``): ``function`` the app's
    function (its object, or its name), ``workload`` the messages (a list, or a seeded generator
    of ``count`` of them), ``invariant`` what must hold of the stored state."""

    function: Any
    workload: Workload
    invariant: Invariant | None = None

    def run(self, *, messages: int = 200, store: str | DedupStore = "memory", azurite: Azurite | None = None,
            faults: Faults = Faults(), seed: int = 1, workers: int = 8, lock_seconds: float = 1.0,
            broker: Broker | None = None) -> Verdict:  # fmt: skip
        return prove(self.function, self.workload, self.invariant, messages=messages, store=store, azurite=azurite,
                     faults=faults, seed=seed, workers=workers, lock_seconds=lock_seconds, broker=broker)  # fmt: skip


def prove(function: Any, workload: Workload, invariant: Invariant | None = None, *, messages: int = 200,
          store: str | DedupStore = "memory", azurite: Azurite | None = None, faults: Faults = Faults(),
          seed: int = 1, workers: int = 8, lock_seconds: float = 1.0,
          broker: Broker | None = None) -> Verdict:  # fmt: skip
    """Run ``function`` (a Service Bus function of the app: its object, or its name) on
    ``workload`` under its broker's semantics and ``faults``, on ``store`` ("memory",
    "table-lean", "table-sdk" — a Table store on ``azurite``, or on one the kit starts — or a
    store of your own), time scaled so that the queue's lock lasts ``lock_seconds``; then the
    checks and ``invariant``. The same seed sends the same messages and draws the same faults."""
    from ..functions._app import using_store
    from ..functions._bindings import app_function  # the Functions face: a proof of an app

    started, since = time.monotonic(), datetime.now(UTC) - timedelta(minutes=1)
    call, trigger = app_function(function)
    broker = broker or Broker.of_app()
    scale = lock_seconds / broker.lock_duration.total_seconds()
    model = _model(trigger, broker, scale)
    logical = list(workload(random.Random(seed), messages) if callable(workload) else workload)
    sends = producer_sends(logical, faults if model.numbered else replace(faults, invalid=0.0), seed)
    verdict = Verdict(seed, store if isinstance(store, str) else type(store).__name__, messages=len(logical))
    queue = model.queue
    by_seq: dict[int, Message] = {}  # what the queue accepted, by the sequence number it gave
    for message in sends:
        if queue.send(message.message_id, message.raw, dict(message.properties)):
            by_seq[queue.accepted] = message
    plan = FaultPlan(faults.rate, seed, lock_seconds)
    plan.latency = 0.002  # a store in memory answers as after a round trip: deliveries interleave as on Azure
    running = threading.local()
    plan.lose_lock = lambda: queue.lose(running.lock) if hasattr(running, "lock") else None
    seen = _Seen(running)
    with ExitStack() as stack:
        server = azurite
        if server is None and store in ("table-lean", "table-sdk"):
            data = stack.enter_context(tempfile.TemporaryDirectory(prefix="proof-"))
            server = stack.enter_context(Azurite(location=Path(data)))
        if faults.outage > 0 and server is not None and server.location is None:
            raise ValueError("an outage restarts Azurite: give one with a location (its data kept), or none")
        used, clean = _stores(store, server, plan)
        stack.enter_context(_scaled_settings(broker, scale))
        stack.enter_context(using_store(used))
        stack.enter_context(seen.counting())

        def deliver(lock: Lock) -> None:
            running.lock = lock
            call(model.binding(lock))

        trouble = _outage(faults.outage, queue, plan, server, verdict)
        deliver_until_drained(queue, deliver, plan, workers, seen, model.retry_in)
        trouble.join()
        if model.numbered:  # a canary closes the audit's window on the sequence numbers
            queue.send(f"{CANARY_PREFIX}{seed}", b"{}", {CANARY_PROPERTY: "proof"})
            deliver_until_drained(queue, deliver, FaultPlan(0.0, seed, lock_seconds), workers, seen)
        verdict.sends, verdict.dropped_by_detection = len(sends), queue.dropped_by_detection
        verdict.deliveries, verdict.faults = queue.deliveries, plan.injected
        verdict.outcomes = Counter(report.outcome for report in seen.reports)
        _check(verdict, by_seq, model, seen, clean, since, invariant)
    verdict.seconds = round(time.monotonic() - started, 2)
    return verdict


@dataclass(frozen=True)
class _Model:
    """A trigger's delivery, scaled: its queue, how long a failed delivery waits before it comes
    again (after its n-th delivery; None: at once), the binding object the function gets, what its
    consumer fingerprints (the payload), and whether the broker numbers what it accepts (the audit)."""

    queue: PeekLockQueue
    retry_in: Callable[[int], float] | None
    binding: Callable[[Lock], Any]
    payload: Callable[[Message], Any]
    numbered: bool


# Event Grid: a delivery not answered within 30 s is retried; a failed one after 10 s, 30 s, 1 min,
# 5 min, 10 min, 30 min, 1 h, … (Event Grid's delivery and retry), up to 30 attempts.
EVENT_GRID_RETRIES = (10, 30, 60, 300, 600, 1800, 3600)


def _model(trigger: str, broker: Broker, scale: float) -> _Model:
    from ..functions._bindings import cloudevent, servicebus_message

    if trigger == "serviceBusTrigger":
        queue = PeekLockQueue(broker.lock_duration.total_seconds() * scale, broker.max_delivery_count,
                              broker.duplicate_window, broker.lock_renewal.total_seconds() * scale)  # fmt: skip

        def message(lock: Lock) -> Any:
            m = lock.message
            return servicebus_message(m.body, m.message_id, delivery_count=lock.delivery_count, sequence_number=m.seq,
                                      enqueued_time=m.enqueued_at, properties=m.properties)  # fmt: skip

        return _Model(queue, None, message, lambda m: json.loads(m.raw), numbered=True)
    if trigger == "eventGridTrigger":

        def event(lock: Lock) -> Any:
            m = lock.message
            return cloudevent(json.loads(m.body), m.message_id or "", m.properties)

        def envelope(m: Message) -> Any:  # what on_eventgrid gives the consumer
            return {"type": m.properties.get("type", "proof.event"), "subject": m.properties.get("subject"),
                    "data": json.loads(m.raw)}  # fmt: skip

        queue = PeekLockQueue(30 * scale, 30, 0)  # no lock renewal, no duplicate detection
        return _Model(queue, lambda n: EVENT_GRID_RETRIES[min(n, len(EVENT_GRID_RETRIES)) - 1] * scale, event,
                      envelope, numbered=False)  # fmt: skip
    raise ValueError(f"the kit proves Service Bus functions (queues, subscriptions) and Event Grid ones; this "
                     f"one's trigger is {trigger}")  # fmt: skip


# -- the producer ---------------------------------------------------------------------------------


def producer_sends(logical: Sequence[Message], faults: Faults, seed: int) -> list[Message]:
    """Every message once; with ``faults.duplicates`` again later (a retry after a lost
    acknowledgement, its body sometimes re-serialised), with ``faults.twins`` another message's
    body under its MessageId, and ``faults.invalid`` messages that are not JSON."""
    rng = random.Random(f"{seed}/producer")
    plan: list[tuple[float, Message]] = []
    for index, message in enumerate(logical):
        plan.append((index, message))
        position = float(index)
        while rng.random() < faults.duplicates:
            position += rng.expovariate(1 / 40)  # near enough for detection to drop some, not all
            plan.append((position, replace(message, body=rng.choice((message.body, _reserialised(message.body))))))
        if len(logical) > 1 and message.message_id is not None and rng.random() < faults.twins:
            other = logical[(index + 1 + rng.randrange(len(logical) - 1)) % len(logical)]
            if other.invalid is None and message.invalid is None and other.body != message.body:
                twin = Message(other.body, message.message_id, properties=message.properties)
                plan.append((index + rng.expovariate(1 / 40), twin))
        if rng.random() < faults.invalid:
            plan.append((index + 0.5, Message(b'{"cut off": ', f"not-json-{seed}-{index}", "invalid_json")))
    plan.sort(key=lambda entry: entry[0])
    return [message for _, message in plan]


def _reserialised(body: Any) -> Any:
    """The same JSON value in other bytes: reversed key order and indented."""
    if isinstance(body, dict):
        return json.dumps(dict(reversed(list(body.items()))), indent=1).encode()
    return body


# -- delivery -------------------------------------------------------------------------------------

Deliver = Callable[[Lock], None]


@dataclass(frozen=True)
class Report:
    """One outcome the consumer reported, for the delivery of sequence number ``seq``."""

    seq: int
    outcome: str
    key: str | None
    consumer: str
    fingerprint: str | None


class _Seen:
    """What the consumer reported, per delivery, from its log records; and which deliveries the
    kit settled how."""

    def __init__(self, running: threading.local) -> None:
        self.running = running
        self.reports: list[Report] = []
        self.completed: dict[int, str | None] = {}  # sequence number → the completing delivery's outcome
        self.crashed_after_commit: set[int] = set()
        self._mutex = threading.Lock()

    def last_outcome(self, seq: int, token: int) -> str | None:
        with self._mutex:
            return self._outcome_of.get((seq, token))

    @contextmanager
    def counting(self) -> Iterator[None]:
        self._outcome_of: dict[tuple[int, int], str] = {}
        seen = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                fields = fields_of(record)
                lock = getattr(seen.running, "lock", None)
                if "outcome" not in fields or lock is None:
                    return
                with seen._mutex:
                    seen.reports.append(Report(lock.message.seq, fields["outcome"], fields.get("dedup_key"),
                                               fields.get("consumer") or "", fields.get("fingerprint")))  # fmt: skip
                    seen._outcome_of[(lock.message.seq, lock.token)] = fields["outcome"]

        logger, handler = logging.getLogger("idempotency"), Handler()
        level, propagate = logger.level, logger.propagate
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)  # every outcome, the everyday ones included
        logger.propagate = False  # a run's thousands of outcome lines stay out of the test's log
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def deliver_until_drained(queue: PeekLockQueue, deliver: Deliver, plan: FaultPlan, workers: int,
                          seen: _Seen | None = None,
                          retry_in: Callable[[int], float] | None = None) -> None:  # fmt: skip
    """``workers`` competing receivers, each settling what it receives, until the queue is empty."""

    def work() -> None:
        while True:
            lock = queue.receive(timeout=0.5)
            if lock is None:
                if queue.drained():
                    return
                continue
            settle(lock, queue, deliver, plan, seen, retry_in)

    threads = [threading.Thread(target=work, name=f"receiver-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def settle(lock: Lock, queue: PeekLockQueue, deliver: Deliver, plan: FaultPlan, seen: _Seen | None = None,
           retry_in: Callable[[int], float] | None = None) -> None:  # fmt: skip
    """As the host settles a delivery: returning completes it, raising abandons it (redelivered at
    once), a crash leaves its lock to lapse; ``settled_without_invoke`` completes a share of first
    deliveries without calling the function (Azure/azure-functions-host#11879)."""
    first = lock.delivery_count == 1  # at a first delivery only: no earlier one can have recorded it
    if first and plan.draw(("settled_without_invoke",), plan.settled_without_invoke) is not None:
        if queue.complete(lock):
            plan.vanished.append((lock.message.seq, lock.message.message_id, lock.message.body))
        return
    if seen is not None and plan.draw(("crash_before_handler",)) is not None:
        queue.crashed(lock)  # the instance died as it received the message
        return
    try:
        deliver(lock)
    except Crash as crash:
        if seen is not None and str(crash) == "crash_after_commit":
            seen.crashed_after_commit.add(lock.message.seq)
        queue.crashed(lock)  # the process died: no settlement, no renewal, the lock lapses
        return
    except Exception as error:  # noqa: BLE001 - the host abandons on any exception (Event Grid: retries later)
        queue.abandon(lock, why=str(error)[:200], delay=retry_in(lock.delivery_count) if retry_in else 0.0)
        return
    if plan.draw(WORKER_FAULTS) is not None:
        queue.crashed(lock)  # died before acknowledging, or the acknowledgement was lost
        return
    if queue.complete(lock) and seen is not None:
        seen.completed[lock.message.seq] = seen.last_outcome(lock.message.seq, lock.token)


def _outage(seconds: float, queue: PeekLockQueue, plan: FaultPlan, azurite: Azurite | None,
            verdict: Verdict) -> threading.Thread:  # fmt: skip
    """Once 40 % of the queue is done, the store goes down for ``seconds``: Azurite stopped and
    started again, or (no Azurite) every store request refused meanwhile."""

    def down() -> None:
        if seconds <= 0:
            return
        while queue.completed < 0.4 * (queue.sent - queue.dropped_by_detection) and not queue.drained():
            time.sleep(0.01)
        if azurite is None:
            plan.throttle(1.0, seconds)
            return
        problem = azurite.outage(seconds)
        if problem is not None:
            verdict.violations.append(problem)

    thread = threading.Thread(target=down, name="outage")
    thread.start()
    return thread


# -- the store and the app -----------------------------------------------------------------------


def _stores(store: str | DedupStore, azurite: Azurite | None, plan: FaultPlan) -> tuple[DedupStore, DedupStore]:
    """(the store the app uses, with the faults; the one the checks read, without)."""
    if store == "memory" or not isinstance(store, str):
        used = MemoryStore() if store == "memory" else store
        assert isinstance(used, DedupStore)
        return used, faulty_calls(used, plan)
    if store not in STORES:
        raise ValueError(f"store {store!r}: one of {', '.join(STORES)}, or a store of your own")
    assert azurite is not None
    from azure.data.tables import TableServiceClient

    from ..stores._azure import TRANSPORT
    from ..stores._table_batch import TableTransactions
    from ..stores._transport import transaction_transport

    table = f"proof{uuid.uuid4().hex[:16]}"
    service = TableServiceClient.from_connection_string(azurite.connection_string, transport=FaultyTransport(plan),
                                                        **TRANSPORT)  # fmt: skip
    lean = None
    if store == "table-lean":
        lean = TableTransactions.of(service, table, transport=FaultyTransport(plan, transaction_transport()),
                                    **TRANSPORT)  # fmt: skip
    clean = TableStore(TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT), table,
                       table + "dl")  # fmt: skip
    clean.create_tables()  # before the run, without its faults
    return TableStore(service, table, table + "dl", transactions=lean), clean


@contextmanager
def _scaled_settings(broker: Broker, scale: float) -> Iterator[None]:
    """The dedup settings the app has (or the defaults), scaled in time as the lock is, and the
    queue's max delivery count: the same proportions as on Azure."""
    config = DedupConfig.from_settings()
    scaled = {"DEDUP_LEASE": config.steps.lease, "DEDUP_IN_FLIGHT_WAIT": config.steps.in_flight_wait,
              "DEDUP_TRANSIENT_WAIT": config.transient_wait}  # fmt: skip
    settings = {name: f"PT{value.total_seconds() * scale:.3f}S" for name, value in scaled.items()}
    settings["DEDUP_MAX_DELIVERY_COUNT"] = str(broker.max_delivery_count)
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- the checks -----------------------------------------------------------------------------------


def _check(verdict: Verdict, by_seq: dict[int, Message], model: _Model, seen: _Seen, store: DedupStore,
           since: datetime, invariant: Invariant | None) -> None:  # fmt: skip
    from ..functions._app import built

    found, queue = verdict.violations, model.queue

    def violation(text: str) -> None:
        if len(found) < 200:
            found.append(text)

    verdict.broker_dead_lettered = len(queue.dead)
    for parked in queue.dead:
        violation(f"left in the broker's dead-letter queue: {parked.message_id} ({parked.dead_reason})")
    scopes = Counter(report.consumer for report in seen.reports if report.consumer)
    consumer = built(scopes.most_common(1)[0][0]) if scopes else None
    if consumer is None:
        violation("the function reported no outcome: does it call its consumer (on_servicebus, on_eventgrid)?")
        return
    # Every delivery the host completed was decided: the function did not return on a failure.
    for seq, outcome in sorted(seen.completed.items()):
        if outcome not in SETTLED:
            violation(f"settled without a decision: sequence {seq} completed after {outcome or 'no outcome'}")
    ours = [report for report in seen.reports if report.consumer == consumer.name]
    payloads = {seq: model.payload(m) for seq, m in by_seq.items() if m.invalid is None}
    places: dict[str, set[str]] = defaultdict(set)  # per key, where its copies would keep its marker (a twin
    for report in ours:  # may name another partition: refused, key_partition_mismatch)
        if report.key is not None and report.seq in payloads:
            places[report.key].add(consumer.partition_of(DedupKey(consumer.name, report.key), payloads[report.seq]))
    markers = {key: [m for place in sorted(where) if (m := store.get(DedupKey(consumer.name, key), place))]
               for key, where in places.items()}  # fmt: skip
    _check_decisions(verdict, by_seq, payloads, ours, markers, seen.crashed_after_commit,
                     store.dead_letters(consumer.name), violation)  # fmt: skip
    if model.numbered:
        _check_audit(verdict, store, consumer.name, queue, since, violation)
    if invariant is not None and not found:
        for problem in invariant(_accepted(payloads, ours, markers, by_seq), Stored(store)):
            violation(f"invariant: {problem}")


def _check_decisions(verdict: Verdict, by_seq: dict[int, Message], payloads: dict[int, Any], reports: list[Report],
                     markers: dict[str, list[Marker]], crashed_after_commit: set[int], dead: list[Any],
                     violation: Callable[[str], None]) -> None:  # fmt: skip
    """Per key, one final marker, whose payload every copy of it was decided as (once reported,
    the same decision each time); each other payload under the key (a twin) refused and recorded.
    Per invalid message, its dead-letter record with its reason."""
    key_of = {report.seq: report.key for report in reports if report.key is not None}
    payload_of = {seq: fingerprint(payload) for seq, payload in payloads.items()}
    said: dict[tuple[str, str | None], Counter[str]] = defaultdict(Counter)  # (key, payload): outcomes
    for report in reports:
        if report.key is not None and report.seq in payload_of:
            said[(report.key, payload_of[report.seq])][report.outcome] += 1
    under: dict[str, set[str]] = defaultdict(set)  # per key, the payloads sent under it
    for seq in sorted(payload_of):
        if seq not in key_of:
            violation(f"never decided: sequence {seq} ({by_seq[seq].message_id}) was completed without a key "
                      "reported")  # fmt: skip
            continue
        under[key_of[seq]].add(payload_of[seq])
    recorded = defaultdict(set)  # per key or MessageId, the payloads refused with a dead-letter record
    for record in dead:
        refused = record.fingerprint or _fingerprint_of(record.body)
        recorded[record.key_id or record.message_id].add(refused)
    for key, sent in sorted(under.items()):
        stored = markers.get(key, [])
        final = [m for m in stored if m.final]
        if not stored and all(_refused(said[(key, fp)]) for fp in sent):
            verdict.decided["refused"] += len(sent)
            if len(sent) == 1:  # no twin beside it: its own payload was refused
                violation(
                    f"a valid message refused as invalid: {key} was reported {dict(said[(key, next(iter(sent)))])}"
                )
            continue
        if len(stored) != 1 or not final:
            violation(f"not decided exactly once: {key} has {len(stored)} markers ({[m.state.value for m in stored]})")
            continue
        marker = final[0]
        decision = {State.COMPLETED: "applied", State.DECLINED: "declined"}.get(marker.state, marker.state.value)
        verdict.decided[decision] += 1
        outcomes = said[(key, marker.fingerprint)]
        decisions = {DECISIONS[o] for o in outcomes if o in DECISIONS}
        if decisions - {decision}:
            violation(f"a decision that changed: {key} is stored {decision}, and was reported {dict(outcomes)}")
        exact = outcomes["processed"] if decision == "applied" else outcomes["declined"]
        # The delivery that committed it may not have learnt it did: it died after the commit, or its
        # answer was lost and its wait ran out (transient). Its copies then say duplicate: never twice.
        unsure = outcomes["transient"] > 0 or any(key_of.get(seq) == key for seq in crashed_after_commit)
        if exact > 1 or (exact == 0 and not unsure):
            violation(f"outcome not exact: {key} ({decision}) was reported {dict(outcomes)}")
        for twin in sent - {marker.fingerprint}:
            if not _refused(said[(key, twin)]) or twin not in recorded[key]:
                violation(f"a twin not refused: {key} with another payload was reported {dict(said[(key, twin)])}, "
                          f"{'with' if twin in recorded[key] else 'without'} a dead-letter record")  # fmt: skip
            else:
                verdict.decided["refused"] += 1
    records = {(d.message_id, d.reason) for d in dead}
    invalid = {(m.message_id, m.invalid, m.raw): m for m in by_seq.values() if m.invalid is not None}
    for message in invalid.values():
        if (message.message_id, message.invalid) not in records:
            violation(f"invalid message without its dead-letter record: {message.message_id} ({message.invalid}): "
                      f"{message.raw[:60]!r}")  # fmt: skip
        else:
            verdict.decided["invalid"] += 1


def _refused(outcomes: Counter[str]) -> bool:
    """Reported only as refused (a conflict, an invalid message), and at least once."""
    return bool(outcomes) and set(outcomes) <= {"conflict", "invalid"}


def _fingerprint_of(body: bytes) -> str | None:
    try:
        return fingerprint(json.loads(body))
    except ValueError:
        return None


def _check_audit(verdict: Verdict, store: DedupStore, scope: str, queue: PeekLockQueue, since: datetime,
                 violation: Callable[[str], None]) -> None:  # fmt: skip
    """Every sequence number the queue gave is accounted for, from what the consumer stored."""
    try:
        found = account(store, scope, queue, after=0, since=since, until=datetime.now(UTC) + timedelta(minutes=1))
    except StoreUnavailable as error:
        violation(f"the audit could not read the store: {error}")
        return
    verdict.audit = found.summary()
    if found.unaccounted:
        violation(
            f"the audit leaves sequence numbers unaccounted: {sorted(g.sequence for g in found.unaccounted)[:20]}"
        )
    if found.received != queue.accepted or found.canaries != 1:
        violation(f"the audit received {found.received} with {found.canaries} canary; the queue accepted "
                  f"{queue.accepted} (1 canary)")  # fmt: skip


def _accepted(payloads: dict[int, Any], reports: list[Report], markers: dict[str, list[Marker]],
              by_seq: dict[int, Message]) -> list[Accepted]:  # fmt: skip
    """One per decided key: the payload its marker's fingerprint names."""
    key_of = {report.seq: report.key for report in reports if report.key is not None}
    found: dict[str, Accepted] = {}
    for seq, payload in sorted(payloads.items()):
        key = key_of.get(seq)
        if key is None or key in found or not markers.get(key):
            continue
        marker = markers[key][0]
        if marker.final and fingerprint(payload) == marker.fingerprint:
            decision = "applied" if marker.state is State.COMPLETED else marker.state.value
            found[key] = Accepted(key, by_seq[seq].message_id, payload, decision)
    return list(found.values())
