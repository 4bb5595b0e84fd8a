"""How the proof kit delivers (``prove``, testing/proof.py), and lab's rigs with it: competing
receivers settling as the host does (``deliver_until_drained``, ``settle``), what the consumer
reported per delivery (``Seen``), a store outage, and each trigger's delivery model (``model_of``:
Service Bus, Event Grid, Storage queues, HTTP with Idempotency-Key), scaled in time."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..telemetry import fields_of
from .azurite import Azurite
from .broker import Lock, PeekLockQueue
from .faults import WORKER_FAULTS, Crash, FaultPlan

if TYPE_CHECKING:
    from ._terms import Broker, Faults, Message, Verdict


Deliver = Callable[[Lock], None]
DeliverMany = Callable[[list[Lock]], None]


@dataclass(frozen=True)
class Report:
    """One outcome the consumer reported, for the delivery of sequence number ``seq``."""

    seq: int
    outcome: str
    key: str | None
    consumer: str
    fingerprint: str | None


class Seen:
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
                held = getattr(seen.running, "locks", None) or {}  # a batch's: by sequence number
                lock = held.get(fields.get("sequence"), getattr(seen.running, "lock", None))
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
                          seen: Seen | None = None, retry_in: Callable[[int], float] | None = None,
                          batches: tuple[int, DeliverMany] | None = None) -> None:  # fmt: skip
    """``workers`` competing receivers, each settling what it receives, until the queue is empty;
    ``batches``: each receives up to that many messages at once and hands them to its function
    together (a trigger's ``cardinality="many"``)."""

    def work() -> None:
        while True:
            lock = queue.receive(timeout=0.5)
            if lock is None:
                if queue.drained():
                    return
                continue
            if batches is None:
                settle(lock, queue, deliver, plan, seen, retry_in)
                continue
            size, deliver_many = batches
            locks = [lock]
            while len(locks) < size and (more := queue.receive(timeout=0)) is not None:
                locks.append(more)
            settle_together(locks, queue, deliver_many, plan, seen, retry_in)

    threads = [threading.Thread(target=work, name=f"receiver-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def settle(lock: Lock, queue: PeekLockQueue, deliver: Deliver, plan: FaultPlan, seen: Seen | None = None,
           retry_in: Callable[[int], float] | None = None) -> None:  # fmt: skip
    """As the host settles a delivery: returning completes it, raising abandons it (redelivered at
    once), a crash leaves its lock to lapse; ``settled_without_invoke`` completes a share of first
    deliveries without calling the function (Azure/azure-functions-host#11879)."""
    first = lock.delivery_count == 1  # at a first delivery only: no earlier one can have recorded it
    if first and plan.draw(("settled_without_invoke",), plan.settled_without_invoke) is not None:
        if queue.complete(lock):
            plan.vanished.append((lock.message.seq, lock.message.message_id, lock.message.body))
        return
    settle_together([lock], queue, lambda locks: deliver(locks[0]), plan, seen, retry_in)


def settle_together(locks: list[Lock], queue: PeekLockQueue, deliver: DeliverMany, plan: FaultPlan,
                    seen: Seen | None = None, retry_in: Callable[[int], float] | None = None) -> None:  # fmt: skip
    """Messages handed to one call, settled as the host settles them: all completed when it
    returns, all abandoned when it raises, all left to lapse when the process dies."""
    plan.delivering()
    if seen is not None and plan.draw(("crash_before_handler",)) is not None:
        for lock in locks:
            queue.crashed(lock)  # the instance died as it received the messages
        return
    try:
        deliver(locks)
    except Crash as crash:
        if seen is not None and str(crash) == "crash_after_commit":
            seen.crashed_after_commit.update(lock.message.seq for lock in locks)
        for lock in locks:
            queue.crashed(lock)  # the process died: no settlement, no renewal, the locks lapse
        return
    except Exception as error:  # noqa: BLE001 - the host abandons on any exception (Event Grid: retries later)
        for lock in locks:
            queue.abandon(lock, why=str(error)[:200], delay=retry_in(lock.delivery_count) if retry_in else 0.0)
        return
    if plan.draw(WORKER_FAULTS) is not None:
        for lock in locks:
            queue.crashed(lock)  # died before acknowledging, or the acknowledgement was lost
        return
    for lock in locks:
        if queue.complete(lock) and seen is not None:
            seen.completed[lock.message.seq] = seen.last_outcome(lock.message.seq, lock.token)


def outage(seconds: float, queue: PeekLockQueue, plan: FaultPlan, azurite: Azurite | None,
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


@dataclass(frozen=True)
class Model:
    """A trigger's delivery, scaled (``scale``: seconds here per second on Azure): its queue, how
        long a failed delivery waits before it comes again (after its n-th delivery; None: at once),
        the binding object the function gets, the id the broker gives a copy (the consumer's logs and
        records name it), what its consumer fingerprints (the payload), whether the broker numbers what
        it accepts (the audit), which of a producer's faults it can carry, and whether what the function
    returned asks for the delivery again (an HTTP answer)."""

    queue: PeekLockQueue
    scale: float
    retry_in: Callable[[int], float] | None
    binding: Callable[[Lock], Any]
    message_id: Callable[[int, str | None], str | None]  # (sequence number, the producer's id)
    payload: Callable[[Message], Any]
    numbered: bool
    producer: Callable[[Faults], Faults]
    answered: Callable[[Any], None] = lambda returned: None  # raises when what the function returned is a retry
    fingerprinted: Callable[[Any], Any] = lambda payload: payload  # what the consumer fingerprints of a payload
    batch: int = 0  # messages handed to one call (cardinality many); 0: one message, not a list


# Event Grid: a delivery not answered within 30 s is retried; a failed one after 10 s, 30 s, 1 min,
# 5 min, 10 min, 30 min, 1 h, … (Event Grid's delivery and retry), up to 30 attempts.
EVENT_GRID_RETRIES = (10, 30, 60, 300, 600, 1800, 3600)
# Service Bus batches: the host hands a call up to maxMessageBatchSize messages (1,000), as many as
# are there, and renews no lock of a batch (maxAutoLockRenewalDuration does not apply to batches);
# the kit up to 32, so that its faults, drawn far more often than Azure's, still let a batch
# through within the max delivery count.
BATCH = 32
# Event Grid: a delivery not answered within 30 s is sent again.
EVENT_GRID_TIMEOUT = 30.0
# Storage queues: the host dequeues a message for 10 minutes and renews that while the function runs.
QUEUE_LEASE = 600.0
HOST_RENEWS = 24 * 3600.0  # a lease renewed for as long as the function runs (a day: longer than any run)
# HTTP: a client that waits 30 s for an answer (none comes after a crash, or it was lost: it sends
# the request again, maybe beside the first), retries after the Retry-After it is told (409 while a
# copy is in flight, 503), and gives up after 10 tries.
HTTP_TIMEOUT, HTTP_TRIES = 30.0, 10


def model_of(trigger: str, broker: Broker, lock_seconds: float) -> Model:
    """The model of ``trigger``, its time scaled so that the time a delivery holds its message
    before a copy may go to another receiver lasts ``lock_seconds``: Service Bus's lock, a
    Storage queue's lease (10 minutes), Event Grid's and an HTTP client's timeout (30 s)."""
    from ..functions._bindings import cloudevent, queue_message, servicebus_message

    scale = lock_seconds / broker.lock_duration.total_seconds()
    if trigger in ("serviceBusTrigger", "serviceBusTrigger (batch)"):
        batch = 0 if trigger == "serviceBusTrigger" else BATCH
        renewal = 0.0 if batch else broker.lock_renewal.total_seconds() * scale
        queue = PeekLockQueue(broker.lock_duration.total_seconds() * scale, broker.max_delivery_count,
                              broker.duplicate_window, renewal)  # fmt: skip

        def message(lock: Lock) -> Any:
            m = lock.message
            return servicebus_message(m.body, m.message_id, delivery_count=lock.delivery_count, sequence_number=m.seq,
                                      enqueued_time=m.enqueued_at, properties=m.properties)  # fmt: skip

        return Model(queue, scale, None, message, _producers_id, _json, numbered=True, producer=_as_sent, batch=batch)
    if trigger == "eventGridTrigger":

        def event(lock: Lock) -> Any:
            m = lock.message
            return cloudevent(json.loads(m.body), m.message_id or "", m.properties)

        def envelope(m: Message) -> Any:  # what on_eventgrid gives the consumer
            return {"type": m.properties.get("type", "proof.event"), "subject": m.properties.get("subject"),
                    "data": json.loads(m.raw)}  # fmt: skip

        scale = lock_seconds / EVENT_GRID_TIMEOUT
        queue = PeekLockQueue(EVENT_GRID_TIMEOUT * scale, 30, 0)  # no lock renewal, no duplicate detection
        retry_in = lambda n: EVENT_GRID_RETRIES[min(n, len(EVENT_GRID_RETRIES)) - 1] * scale  # noqa: E731
        return Model(queue, scale, retry_in, event, _producers_id, envelope, numbered=False, producer=_json_only)
    if trigger == "queueTrigger":
        from ..functions._host import host_setting, timespan
        from ..functions._storage_queue import max_dequeue_count

        scale = lock_seconds / QUEUE_LEASE
        visible_after = timespan(host_setting("extensions", "queues", "visibilityTimeout")) or timedelta(0)
        # the lease renewed for as long as the function runs; no duplicate detection
        queue = PeekLockQueue(QUEUE_LEASE * scale, max_dequeue_count(), 0, lock_renewal=HOST_RENEWS * scale)

        def dequeued(lock: Lock) -> Any:
            m = lock.message
            return queue_message(m.body, _service_id(m.seq, m.message_id), dequeue_count=lock.delivery_count,
                                 insertion_time=m.enqueued_at)  # fmt: skip

        return Model(queue, scale, lambda n: visible_after.total_seconds() * scale, dequeued, _service_id, _json,
                     numbered=False, producer=_no_twins)  # fmt: skip
    if trigger == "httpTrigger":
        from ..functions._bindings import http_request
        from ..functions._http import RETRY_AFTER_SECONDS, caller_identity

        def request(lock: Lock) -> Any:
            return http_request(lock.message.body, idempotency_key=lock.message.message_id, url="/api/proof")

        origin = caller_identity(http_request(b"{}", url="/api/proof"))  # who the client is, to the app
        scale = lock_seconds / HTTP_TIMEOUT
        retry_after = float(RETRY_AFTER_SECONDS) * scale
        return Model(PeekLockQueue(HTTP_TIMEOUT * scale, HTTP_TRIES, 0), scale, lambda n: retry_after, request,
                     _producers_id, _json, numbered=False, producer=_one_body_per_key, answered=_client_retries,
                     fingerprinted=lambda payload: {"origin": origin, "payload": payload})  # fmt: skip
    raise ValueError(f"{trigger}: the proof kit models Service Bus (a queue or a subscription, one message at a "
                     "time or a batch), Event Grid, Storage queue and HTTP triggers")  # fmt: skip


def _producers_id(seq: int, message_id: str | None) -> str | None:
    return message_id


def _service_id(seq: int, message_id: str | None) -> str:
    """A Storage queue message's id: the service's, one per enqueue (a producer's retry gets another)."""
    return str(uuid.UUID(int=seq))


def _json(m: Message) -> Any:
    return json.loads(m.raw)


def _as_sent(faults: Faults) -> Faults:
    return faults


def _json_only(faults: Faults) -> Faults:
    """Event Grid: a CloudEvent is JSON (nothing invalid is sent)."""
    return replace(faults, invalid=0.0)


def _no_twins(faults: Faults) -> Faults:
    """A Storage queue: each enqueue gets its own id, so a twin is only another message's copy."""
    return replace(faults, twins=0.0)


def _one_body_per_key(faults: Faults) -> Faults:
    """A client's retries: the same JSON body under its Idempotency-Key (no twins, nothing invalid)."""
    return replace(faults, invalid=0.0, twins=0.0)


class RetryAfter(Exception):
    """An HTTP answer its client sends the request again for."""


def _client_retries(response: Any) -> None:
    if response.status_code >= 500 or (response.status_code == 409 and "Retry-After" in response.headers):
        raise RetryAfter(f"{response.status_code}: {response.get_body()[:120]!r}")
