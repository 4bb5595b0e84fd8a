"""The idempotent-consumer flow. Trigger-neutral: a trigger turns its binding into a
Delivery, calls ``process`` and settles the returned Result (see ``functions``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from opentelemetry import trace

from . import telemetry
from .config import DedupConfig
from .errors import (
    DedupError,
    DownstreamRejected,
    DownstreamUnavailable,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    StoreUnavailable,
)
from .keys import DedupKey, KeySource, consumer_partition, from_message_id
from .messages import (
    RETRY_OUTCOMES,
    Delivery,
    Effects,
    LatestState,
    Outcome,
    Result,
    check_result,
    utcnow,
)
from .outbox import Outbox, Parked, Sender, outgoing, rows, rows_prefix
from .payload import fingerprint, parse_json
from .steps import Context, settle
from .stores._base import DedupStore
from .stores._records import Commit, CommitStatus, DeadLetter, Marker, State, StateStatus

log = logging.getLogger("idempotency")


PARKED = "parked"  # a dead-letter record's reason: kept for replay, the source moved on
_COMMITTED = frozenset({Outcome.PROCESSED, Outcome.DUPLICATE})  # the marker is there: its outbox is due
_REFUSALS = frozenset({Outcome.INVALID, Outcome.CONFLICT})  # recorded as dead letters before acknowledging
# What clears by itself: waited for inside the delivery. A handler's own exception is not
# (the same code fails the same way): it goes back to the broker at once.
_WAIT_FOR = frozenset({"store_unavailable", "downstream_unavailable", "lease_lost", "claimed_elsewhere",
                       "dead_letter_failed", "dispatch_failed"})  # fmt: skip
# Pauses between attempts, as shares of the delivery's wait (2 min: 0.2 s doubling up to 5 s),
# with jitter; scaled so that a shorter wait (Event Grid, HTTP, a scaled test) keeps its attempts.
FIRST_PAUSE, MAX_PAUSE = 1 / 600, 1 / 24


Handler = Callable[[Any, Context], Effects | LatestState]
"""Decides the entities to commit with the marker (or the latest state to apply);
effects outside the transaction go through ``context.step`` (two-phase). Do not catch
broad exceptions around a step: its errors (in flight, mismatch, lease lost) are the
flow's to settle."""

_STATE_OUTCOMES = {StateStatus.APPLIED: Outcome.PROCESSED, StateStatus.SAME: Outcome.DUPLICATE,
                   StateStatus.STALE: Outcome.STALE}  # fmt: skip


def _fingerprint(delivery: Delivery, payload: Any) -> str:
    return fingerprint(payload if delivery.origin is None else {"origin": delivery.origin, "payload": payload})


class CompletedKeys:
    """A bounded, thread-safe LRU of (key → fingerprint) this instance saw completed. A
    completed marker never goes back, so a hit with the same fingerprint is a duplicate
    without asking the store; a miss proves nothing and goes to the store."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[DedupKey, str] = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key: DedupKey) -> str | None:
        if self._size <= 0:
            return None
        with self._mutex:
            fp = self._keys.get(key)
            if fp is not None:
                self._keys.move_to_end(key)
            return fp

    def put(self, key: DedupKey, fp: str) -> None:
        if self._size <= 0:
            return
        with self._mutex:
            self._keys[key] = fp
            self._keys.move_to_end(key)
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)


class IdempotentConsumer:
    """Stable key → atomic claim-and-commit → explicit outcome.

    ``name`` is the consumer's identity in the shared store: keep it stable across
    function renames, and distinct per subscriber.
    """

    def __init__(
        self,
        name: str,
        store: DedupStore,
        handler: Handler,
        *,
        key_source: KeySource = from_message_id,
        schema: Mapping[str, Any] | None = None,
        config: DedupConfig | None = None,
        partition_for: Callable[[DedupKey], str] = lambda key: key.id,
        replay_results: bool = False,
        record_refusals: bool = True,
        bind_request_keys: bool = False,
        sender: Sender | None = None,
    ) -> None:
        """``config``: retention, step lease and wait, cache size; by default read from the
        app settings (``DedupConfig.from_settings()``), as the README documents them.
        ``replay_results``: a duplicate reads the stored result back (one more read,
        for duplicates only) — HTTP needs it, a queue does not. ``record_refusals``:
        invalid and conflicting messages are written to the dead-letter records before
        they are acknowledged — a queue needs it, HTTP tells its caller instead.
        ``bind_request_keys``: the delivery's ``message_id`` is the caller's request key
        (HTTP ``Idempotency-Key``) while ``key_source`` keys by the body: each request key
        is bound to its payload (one conditional insert), so a key reused with another
        payload is refused (``idempotency_key_reused``, HTTP 422), and a new key for a
        known payload still replays.
        ``sender``: sends what handlers declare in ``Effects.messages`` (the outbox: committed
        with the marker, sent after the commit and again on duplicates until sent).
        The cache keeps keys this instance saw completed, so that hot duplicates cost no
        store request; never an in-progress key, never trusted to decide "new"."""
        config = config or DedupConfig.from_settings()
        if not name or "|" in name or name.startswith("~"):
            raise ValueError(f"consumer name {name!r}: non-empty, without '|', not starting with '~' (the library's)")
        self.name = name
        self.store = store
        self._handler = handler
        self._key_source = key_source
        self._validator = Draft202012Validator(schema) if schema is not None else None
        self._retention = config.retention
        self._steps = config.steps
        self._partition_for = partition_for
        self._replay = replay_results
        self._record_refusals = record_refusals
        self._bind_request_keys = bind_request_keys
        self._completed = CompletedKeys(0 if replay_results else config.cache_size)  # replays need the result
        self._transient_wait = config.transient_wait
        self._max_deliveries = config.max_deliveries
        self.sender = sender
        self._sweep_delay = config.outbox_sweep_delay

    def identify(self, delivery: Delivery) -> tuple[DedupKey, str, str]:
        """Key, partition and fingerprint as processing derives them, or InvalidMessage
        when processing would dead-letter the message; touches no store."""
        payload, key, fp = self._read(delivery)
        self._validate(payload)
        return key, self.partition_of(key), fp

    def _read(self, delivery: Delivery) -> tuple[Any, DedupKey, str]:
        payload = parse_json(delivery.body)
        key = DedupKey(self.name, self._key_source(delivery.message_id, payload) or "")
        return payload, key, _fingerprint(delivery, payload)

    def outbox(self, sender: Sender) -> Outbox:
        """Its outbox, on its store (as it is now: tools may swap the store) and ``sender``."""
        return Outbox(self.store, sender, sweep_delay=self._sweep_delay)

    def partition_of(self, key: DedupKey) -> str:
        return consumer_partition(self.name, self._partition_for(key))

    def process(self, delivery: Delivery) -> Result:
        return self.process_batch([delivery])[0]

    def process_batch(self, deliveries: Sequence[Delivery]) -> list[Result]:
        """Each message is decided on its own; the commits of those that share a
        partition go to the store together (``commit_many``: on Table Storage, up to 100
        operations per transaction), and a conflict isolates only its own message.
        A transient failure is tried again, with growing pauses, until the delivery's
        wait runs out; on the broker's last delivery, what still fails is recorded as a
        dead letter with its reason before the broker takes the message."""
        started = time.perf_counter()
        wait = min((self._transient_wait if d.wait is None else d.wait for d in deliveries), default=timedelta(0))
        deadline = time.monotonic() + wait.total_seconds()  # the first attempt counts too
        spans = [telemetry.span(self.name, d) for d in deliveries]
        # Each delivery's token: its claims and its marker carry it, so a retry knows its own writes.
        owners = [f"{random.getrandbits(128):032x}" for _ in deliveries]
        parked: dict[DedupKey, Parked] = {}  # keys indexed for the outbox sweep, once per delivery
        try:
            attempt_started = time.monotonic()
            results = self._attempt(deliveries, spans, owners, parked, retry=False)
            slowest = time.monotonic() - attempt_started
            pause, cap = wait.total_seconds() * FIRST_PAUSE, wait.total_seconds() * MAX_PAUSE
            while True:
                again = [i for i, r in enumerate(results) if r.outcome in RETRY_OUTCOMES and r.reason in _WAIT_FOR]
                nap = random.uniform(pause / 2, pause)  # jitter: instances do not retry in step
                if not again or time.monotonic() + nap + slowest > deadline:  # an attempt must end by the deadline
                    break
                time.sleep(nap)
                pause = min(pause * 2, cap)
                attempt_started = time.monotonic()
                retried = self._attempt([deliveries[i] for i in again], [spans[i] for i in again],
                                        [owners[i] for i in again], parked, retry=True)  # fmt: skip
                slowest = max(slowest, time.monotonic() - attempt_started)
                for i, result in zip(again, retried, strict=True):
                    results[i] = result
            finished: list[Result] = []
            for delivery, result, span in zip(deliveries, results, spans, strict=True):
                if result.outcome in RETRY_OUTCOMES and self._last(delivery):
                    if self._record_refusals:
                        self._dead_letter(delivery, result)  # the broker dead-letters it next: say why
                    if self.sender is not None and result.key is not None and result.key not in parked:
                        self._park(self.outbox(self.sender), self.partition_of(result.key), result.key, parked)  # rows
                        # an earlier delivery may have left
                telemetry.record(self.name, delivery, result, (time.perf_counter() - started) * 1000, span)
                finished.append(result)
        finally:
            for span in spans:
                span.end()
        return finished

    def _attempt(self, deliveries: Sequence[Delivery], spans: Sequence[trace.Span], owners: Sequence[str],
                 parked: dict[DedupKey, Parked], *, retry: bool) -> list[Result]:  # fmt: skip
        decided = []
        siblings: dict[DedupKey, Context] = {}  # the steps whose completion a decided message holds
        for delivery, span, owner in zip(deliveries, spans, owners, strict=True):
            with trace.use_span(span):  # current while its own handler runs: its calls are children
                decided.append(self._decide(delivery, owner, retry, parked, siblings))
        # A completion a later copy of the same message wrote already (it met the claim) no
        # longer rides with the commit: the claim's version it is fenced by has moved.
        decided = [item._replace(completions=tuple(c for c in item.completions if c.key in siblings))
                   if isinstance(item, Commit) and item.completions else item for item in decided]  # fmt: skip
        committed = iter(self._commit([item for item in decided if isinstance(item, Commit)]))
        results = []
        for delivery, item in zip(deliveries, decided, strict=True):
            result = next(committed) if isinstance(item, Commit) else item
            if self.sender is not None and isinstance(item, Commit) and result.outcome in _COMMITTED:
                result = self._dispatch(self.outbox(self.sender), delivery, item, result, retry, parked)
            if self._record_refusals and result.outcome in _REFUSALS:
                result = self._dead_letter(delivery, result)
            results.append(result)
        return results

    def _last(self, delivery: Delivery) -> bool:
        return delivery.delivery_count is not None and delivery.delivery_count >= self._max_deliveries

    def _parks(self, delivery: Delivery) -> bool:
        """Nobody is sure to deliver it again if it is not acknowledged: an HTTP call (no
        delivery count), a broker's last delivery. Its outgoing messages are indexed for the
        sweep before the commit."""
        return delivery.delivery_count is None or self._last(delivery)

    def _dispatch(self, outbox: Outbox, delivery: Delivery, commit: Commit, result: Result, retry: bool,
                  parked: dict[DedupKey, Parked]) -> Result:  # fmt: skip
        """Send what the commit holds: the rows just committed, or (a duplicate, a retry)
        those the store still has. A failed send waits and retries as any transient failure;
        a delivery nobody redelivers is parked and acknowledged: its messages are committed,
        the sweep sends them. A sent delivery takes its index row back: the sweep only ever
        meets what is really left."""
        prefix = rows_prefix(commit.key)
        fresh = result.outcome is Outcome.PROCESSED and not retry
        try:
            outbox.dispatch(commit.partition, prefix, [e for e in commit.effects if e.name.startswith(prefix)]
                            if fresh else None)  # fmt: skip
        except DedupError as exc:
            # Parked again: the row written before the commit may be gone already (a sweep that
            # met it before the commit found nothing to send, and took it).
            if self._parks(delivery) and self._park(outbox, commit.partition, commit.key, parked):
                # An HTTP call's send waits for the sweep quietly; a broker's last delivery alerts
                # (a destination missing or a role not granted fails every send until fixed).
                log.log(logging.WARNING if delivery.delivery_count is None else logging.ERROR,
                        "dedup outbox: %s left for the sweep: %s", commit.key, exc)  # fmt: skip
                return replace(result, reason="outbox_parked", detail=str(exc)[:500])
            return Result(Outcome.TRANSIENT, commit.key, "dispatch_failed", str(exc)[:500],
                          fingerprint=commit.fingerprint)  # fmt: skip
        if commit.key in parked:
            outbox.unpark(parked.pop(commit.key))
        # Only now may a duplicate skip the store: the cache must never outlive a send that
        # did not finish (a crash in a test, an exception a sender should not raise).
        self._completed.put(commit.key, commit.fingerprint)
        return result

    @staticmethod
    def _park(outbox: Outbox, partition: str, key: DedupKey, parked: dict[DedupKey, Parked]) -> bool:
        try:
            parked[key] = outbox.park(partition, key, again=parked.get(key))
        except DedupError:
            return False  # not parked: the message is not acknowledged either
        return True

    def _decide(self, delivery: Delivery, owner: str, retry: bool, parked: dict[DedupKey, Parked],
                siblings: dict[DedupKey, Context] | None = None) -> Result | Commit:  # fmt: skip
        """Everything up to the commit: parse, key, validate, fingerprint, the cache of
        completed keys, then the handler (and its two-phase steps)."""
        key: DedupKey | None = None
        fp: str | None = None
        context: Context | None = None
        try:
            payload, key, fp = self._read(delivery)
            self._validate(payload)
            if self._completed.get(key) == fp:
                return Result(Outcome.DUPLICATE, key, "completed_recently", fingerprint=fp, stored_fingerprint=fp)
            partition, expires_at = self.partition_of(key), utcnow() + self._retention
            if self._bind_request_keys and delivery.message_id:
                self._bind(delivery.message_id, fp, expires_at)
            context = Context(key, partition, fp, self.store, self._steps, expires_at, owner, siblings)
            effects = self._handler(payload, context)
            if isinstance(effects, LatestState):
                context.settle()
                status = self.store.upsert_if_newer(partition, effects.entity, effects.version)
                if status is StateStatus.CONFLICT:  # recorded as a dead letter and alerted, as any conflict
                    detail = f"version {effects.version} is already applied with other data; the stored state is kept"
                    return Result(Outcome.CONFLICT, key, "version_conflict", detail, fingerprint=fp)
                return Result(_STATE_OUTCOMES[status], key, response=effects.result, fingerprint=fp)
            if not isinstance(effects, Effects):
                raise InvalidMessage("handler_result", f"the handler returned {type(effects).__name__}, "
                                     "not Effects or LatestState")  # fmt: skip
            steps = context.completions
            if len(effects.entities) + len(effects.messages) + len(steps) > self.store.max_effects:
                raise InvalidMessage("too_many_effects", f"{len(effects.entities)} entities, "
                                     f"{len(effects.messages)} outgoing messages and {len(steps)} steps; "
                                     f"one commit holds {self.store.max_effects}")  # fmt: skip
            check_result(effects.result, "the handler's result")
            entities = list(effects.entities)
            if effects.messages:
                if self.sender is None:
                    raise ValueError(f"consumer {self.name!r} has no sender for the handler's outgoing messages")
                outgoing_rows = rows(key, effects.messages)
                check = getattr(self.sender, "check", None)  # what the sender can never send: refused now
                if check is not None:
                    check([outgoing(row) for row in outgoing_rows])
                entities += outgoing_rows
                if self._parks(delivery) and key not in parked:
                    parked[key] = self.outbox(self.sender).park(partition, key)
            return Commit(key, partition, fp, entities, effects.result, expires_at, owner, retry, steps)
        except Exception as exc:  # noqa: BLE001 - mapped to exactly one outcome below
            if context is not None:
                context.settle()  # the steps it called stay completed
            return self._failure(exc, key, fp)

    def _bind(self, request_key: str, fp: str, expires_at: datetime) -> None:
        """Bind a caller's request key to this payload: the first binding wins (a conditional
        insert), and the key is refused with any other payload. A scope of its own
        (consumer names hold no "|") keeps these records apart from the messages' markers."""
        key = DedupKey(f"{self.name}|request", request_key)
        marker = Marker(key, consumer_partition(self.name, "request|" + request_key), State.COMPLETED, fp,
                        utcnow(), expires_at)  # fmt: skip
        if self.store.insert(marker) is not None:
            return
        bound = self.store.get(key, marker.partition)
        if bound is not None and bound.fingerprint != fp:
            raise InvalidMessage("idempotency_key_reused", "this Idempotency-Key was sent with another payload")

    def _commit(self, pending: list[Commit]) -> list[Result]:
        if not pending:
            return []
        claiming = time.perf_counter()
        try:
            commits = self.store.commit_many(pending)
        except DedupError as exc:  # not about one message's data (that is CommitStatus.REFUSED): all wait
            for item in pending:
                settle(self.store, item.completions)
            return [Result(Outcome.TRANSIENT, p.key, "store_unavailable", str(exc)[:500]) for p in pending]
        except Exception as exc:  # noqa: BLE001 - a bug: all retry
            for item in pending:
                settle(self.store, item.completions)
            return [self._failure(exc, p.key, p.fingerprint) for p in pending]
        per_message = (time.perf_counter() - claiming) * 1000 / len(pending)
        results = []
        for item, commit in zip(pending, commits, strict=True):
            telemetry.claim_duration(self.name, per_message)
            if commit.status is CommitStatus.LEASE_LOST:
                results.append(Result(Outcome.TRANSIENT, item.key, "lease_lost", "a step's claim was taken over"))
                continue
            if commit.status is not CommitStatus.NEW:  # its steps' completions were not written
                settle(self.store, item.completions)
            if commit.status is CommitStatus.MISMATCH:
                results.append(self._mismatch(item.key, item.fingerprint, commit.stored_fingerprint))
                continue
            if commit.status is CommitStatus.REFUSED:
                results.append(Result(Outcome.INVALID, item.key, "store_refused", commit.detail))
                continue
            if self.sender is None:  # else once its outgoing messages are sent (_dispatch)
                self._completed.put(item.key, item.fingerprint)
            if commit.status is CommitStatus.NEW:
                results.append(Result(Outcome.PROCESSED, item.key, response=item.result, fingerprint=item.fingerprint))
            else:
                results.append(self._duplicate(item.key, item.partition, item.fingerprint, commit.stored_fingerprint))
        return results

    def _failure(self, exc: Exception, key: DedupKey | None, fp: str | None) -> Result:
        if isinstance(exc, InvalidMessage):
            return Result(Outcome.INVALID, key, exc.reason, exc.detail)
        if isinstance(exc, DownstreamRejected):
            return Result(Outcome.INVALID, key, "downstream_rejected", str(exc)[:500])
        if isinstance(exc, FingerprintMismatch):
            return self._mismatch(key, fp or "", exc.stored_fingerprint)
        if isinstance(exc, InFlight):
            return Result(Outcome.IN_FLIGHT, key, "claimed_elsewhere", "another delivery holds a live claim")
        transient = {StoreUnavailable: "store_unavailable", DownstreamUnavailable: "downstream_unavailable",
                     LeaseLost: "lease_lost"}  # fmt: skip
        for kind, reason in transient.items():  # subclasses too
            if isinstance(exc, kind):
                return Result(Outcome.TRANSIENT, key, reason, str(exc)[:500])
        log.error("dedup handler failed for %r", str(key), exc_info=exc)  # a bug: never acknowledge it
        return Result(Outcome.TRANSIENT, key, "handler_error", repr(exc)[:500])

    def _duplicate(self, key: DedupKey, partition: str, fp: str, stored_fp: str | None) -> Result:
        if not self._replay:
            return Result(Outcome.DUPLICATE, key, fingerprint=fp, stored_fingerprint=stored_fp)
        try:
            stored = self.store.get(key, partition)
        except DedupError as exc:  # the replay could not be read: wait and try again
            return Result(Outcome.TRANSIENT, key, "store_unavailable", str(exc)[:500])
        result = stored.result if stored else None
        return Result(Outcome.DUPLICATE, key, response=result, fingerprint=fp, stored_fingerprint=stored_fp)

    @staticmethod
    def _mismatch(key: DedupKey | None, fp: str, stored: str | None) -> Result:
        detail = "the key was already processed with a different payload"
        return Result(Outcome.CONFLICT, key, "fingerprint_mismatch", detail, fingerprint=fp, stored_fingerprint=stored)

    def _validate(self, payload: Any) -> None:
        if self._validator is None:
            return
        error = best_match(self._validator.iter_errors(payload))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(root)"
            raise InvalidMessage("schema_violation", f"{where}: {error.message[:400]}")

    def park(self, delivery: Delivery, result: Result) -> Result:
        """Keep a message the source will not deliver again (an Event Hubs checkpoint moved
        past it) as a dead-letter record with reason ``parked`` and why, for an operator to
        replay (``python -m shared.idempotency.replay``). TRANSIENT ``dead_letter_failed``
        when it could not even be recorded."""
        why = f"{result.reason or result.outcome.value}: {result.detail or ''}"[:500]
        parked = replace(result, outcome=Outcome.PARKED, reason=PARKED, detail=why)
        span = telemetry.span(self.name, delivery)
        try:  # counted again as its final outcome: the delivery was transient, its event is parked
            recorded = self._dead_letter(delivery, parked)
            telemetry.record(self.name, delivery, recorded, 0.0, span)
        finally:
            span.end()
        return recorded

    def _dead_letter(self, delivery: Delivery, result: Result) -> Result:
        """Record the refused message durably before it is acknowledged; if that fails,
        the message must go back to the broker instead."""
        record = DeadLetter(
            scope=self.name,
            reason=result.reason or result.outcome.value,
            detail=result.detail or "",
            body=delivery.body,
            message_id=delivery.message_id,
            correlation_id=delivery.correlation_id,
            delivery_count=delivery.delivery_count,
            key_id=result.key.id if result.key else None,
            fingerprint=result.fingerprint,
            stored_fingerprint=result.stored_fingerprint,
        )
        try:
            self.store.dead_letter(record)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the broker keeps the message
            return Result(Outcome.TRANSIENT, result.key, "dead_letter_failed", repr(exc)[:500])
        return result
