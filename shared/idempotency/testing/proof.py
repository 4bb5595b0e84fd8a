"""Prove a consumer of your app exactly once in effect, in one call of your test:

    verdict = prove(on_invoice, [Message({"invoiceId": f"inv-{i}", "amount": i}, f"inv-{i}") for i in range(200)])
    assert verdict.ok, verdict

The kit sends the workload as a producer does (retries with the body re-serialised, twins: the
same MessageId with another body, invalid messages), delivers it to the function as its broker
does (Service Bus peek-lock: competing receivers, abandon redelivers at once, locks that lapse or
are lost while a second receiver takes the message, completions lost after success, max delivery
count → dead-letter queue, duplicate detection over a window; Event Grid: a 30 s answer, retries
on its schedule; Storage queues: the host's lease, visible again after visibilityTimeout, the
poison queue after maxDequeueCount, the service's own id per enqueue; HTTP: a client's timeout and
retries after Retry-After, copies beside a slow request: testing/delivery.py), with
seeded faults (a crash before the handler, before and after the commit, before settlement; store
requests answered 503, applied with their answer lost; an outage), then checks what is stored:
every valid message decided exactly once, none lost, nothing left in the broker's dead-letter
queue, every invalid message recorded once with its reason, twins refused, outcomes exact, the
audit's identity closed — and
your invariant. docs/testing.md says what is modelled and what is kinder than Azure."""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ..config import DedupConfig
from ..facts import CANARY_PREFIX, CANARY_PROPERTY
from ..stores import DedupStore, MemoryStore, TableStore
from ._checks import check
from ._terms import Broker, Faults, Invariant, Message, Verdict, Workload
from .azurite import Azurite
from .broker import Lock
from .delivery import Seen, deliver_until_drained, model_of, outage
from .faults import FaultPlan, FaultyTransport, faulty_calls

STORES = ("memory", "table-lean", "table-sdk")
DEFAULT_FAULTS = Faults()


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
            faults: Faults = DEFAULT_FAULTS, seed: int = 1, workers: int = 8, lock_seconds: float = 1.0,
            broker: Broker | None = None) -> Verdict:  # fmt: skip
        return prove(self.function, self.workload, self.invariant, messages=messages, store=store, azurite=azurite,
                     faults=faults, seed=seed, workers=workers, lock_seconds=lock_seconds, broker=broker)  # fmt: skip


def prove(function: Any, workload: Workload, invariant: Invariant | None = None, *, messages: int = 200,
          store: str | DedupStore = "memory", azurite: Azurite | None = None, faults: Faults = DEFAULT_FAULTS,
          seed: int = 1, workers: int = 8, lock_seconds: float = 1.0,
          broker: Broker | None = None) -> Verdict:  # fmt: skip
    """Run ``function`` (a Service Bus, Event Grid, Storage queue or HTTP function of the app: its
    object, or its name) on ``workload`` under its broker's semantics and ``faults``, on ``store`` ("memory",
    "table-lean", "table-sdk" — a Table store on ``azurite``, or on one the kit starts — or a
    store of your own), time scaled so that the queue's lock (a Storage queue: the host's lease)
    lasts ``lock_seconds``; then the
    checks and ``invariant``. The same seed sends the same messages and draws the same faults."""
    from ..functions._app import using_store
    from ..functions._bindings import app_function  # the Functions face: a proof of an app

    started, since = time.monotonic(), datetime.now(UTC) - timedelta(minutes=1)
    call, trigger = app_function(function)
    broker = broker or Broker.of_app()
    model = model_of(trigger, broker, lock_seconds)
    scale = model.scale
    logical = list(workload(random.Random(seed), messages) if callable(workload) else workload)
    sends = producer_sends(logical, model.producer(faults), seed)
    verdict = Verdict(seed, store if isinstance(store, str) else type(store).__name__, messages=len(logical))
    queue = model.queue
    by_seq: dict[int, Message] = {}  # what the queue accepted, by the sequence number it gave
    for message in sends:
        if queue.send(message.message_id, message.raw, dict(message.properties)):
            by_seq[queue.accepted] = message
    plan = FaultPlan(faults.rate, seed, lock_seconds)
    plan.latency = 0.002  # a store in memory answers as after a round trip: deliveries interleave as on Azure
    running = threading.local()

    def lose_locks() -> None:  # a lock_expiry fault: what this thread's delivery holds
        for lock in getattr(running, "held", []):
            queue.lose(lock)

    plan.lose_lock = lose_locks
    seen = Seen(running)
    with ExitStack() as stack:
        server = azurite if store in ("table-lean", "table-sdk") else None  # what an outage stops
        if server is None and store in ("table-lean", "table-sdk"):
            data = stack.enter_context(tempfile.TemporaryDirectory(prefix="proof-"))
            server = stack.enter_context(Azurite(location=Path(data)))
        if faults.outage > 0 and server is not None and server.location is None:
            raise ValueError("an outage restarts Azurite: give one with a location (its data kept), or none")
        used, clean = _stores(store, server, plan)
        stack.enter_context(_scaled_settings(broker, scale))
        stack.enter_context(_scaled_waits(scale))
        stack.enter_context(using_store(used))
        stack.enter_context(seen.counting())

        def deliver(lock: Lock) -> None:
            running.lock, running.locks, running.held = lock, None, [lock]
            model.answered(call(model.binding(lock)))

        def deliver_many(locks: list[Lock]) -> None:
            running.lock, running.locks, running.held = None, {lock.message.seq: lock for lock in locks}, locks
            call([model.binding(lock) for lock in locks])

        trouble = outage(faults.outage, queue, plan, server, verdict)
        batches = (model.batch, deliver_many) if model.batch else None
        deliver_until_drained(queue, deliver, plan, workers, seen, model.retry_in, batches)
        trouble.join()
        if model.numbered:  # a canary closes the audit's window on the sequence numbers
            queue.send(f"{CANARY_PREFIX}{seed}", b"{}", {CANARY_PROPERTY: "proof"})
            deliver_until_drained(queue, deliver, FaultPlan(0.0, seed, lock_seconds), workers, seen, None, batches)
        verdict.sends, verdict.dropped_by_detection = len(sends), queue.dropped_by_detection
        verdict.deliveries, verdict.faults = queue.deliveries, plan.injected
        verdict.outcomes = Counter(report.outcome for report in seen.reports)
        check(verdict, by_seq, model, seen, clean, since, invariant)
    verdict.seconds = round(time.monotonic() - started, 2)
    return verdict


# -- the producer ---------------------------------------------------------------------------------


def producer_sends(logical: Sequence[Message], faults: Faults, seed: int) -> list[Message]:
    """Every message once; with ``faults.duplicates`` again later (a retry after a lost
    acknowledgement, its body sometimes re-serialised; one in four at once, beside the first),
    with ``faults.twins`` another message's body under its MessageId, and ``faults.invalid``
    messages that are not JSON."""
    rng = random.Random(f"{seed}/producer")
    plan: list[tuple[float, Message]] = []
    for index, message in enumerate(logical):
        plan.append((index, message))
        position = float(index)
        while rng.random() < faults.duplicates:
            # near enough for detection to drop some, not all; one in four at once (racing the first)
            position += rng.expovariate(1 / 40) if rng.random() < 0.75 else 0.001
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


@contextmanager
def _scaled_waits(scale: float) -> Iterator[None]:
    """The waits inside an HTTP or Event Grid call for a store failure to clear (constants of the
    adapters, not settings), scaled as the caller's timeout is."""
    from ..functions import _cloudevents_http, _eventgrid, _http

    waits = [(_http, "HTTP_WAIT"), (_cloudevents_http, "HTTP_WAIT"), (_eventgrid, "EVENT_GRID_WAIT")]
    saved = [getattr(module, name) for module, name in waits]
    for (module, name), wait in zip(waits, saved, strict=True):
        setattr(module, name, wait * scale)
    try:
        yield
    finally:
        for (module, name), wait in zip(waits, saved, strict=True):
            setattr(module, name, wait)
