"""The idempotent-consumer flow: decide → commit → settle. Trigger-neutral: a trigger turns
its binding into a Delivery, calls ``process`` and settles the returned Result (see
``functions``). The outbox's side of a delivery is ``outbox.Dispatch``; the wait for what
clears by itself, ``wait.py``."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from opentelemetry import context as otel_context
from opentelemetry import trace

from . import canary, dead_letters, facts, telemetry, wait
from .cache import CompletedKeys
from .config import EXPIRY_MARGIN, DedupConfig
from .errors import DedupError, InvalidMessage
from .keys import DedupKey, KeySource, consumer_partition, from_message_id
from .messages import (
    RETRY_OUTCOMES,
    Declined,
    Delivery,
    Effects,
    LatestState,
    Outcome,
    Result,
    check_result,
    failure,
    mismatch,
    utcnow,
)
from .outbox import Dispatch, Outbox, Sender
from .payload import fingerprint, parse_json
from .reasons import Reason
from .steps import Context, settle
from .stored import AlreadyDecided, PartitionView
from .stores._base import DedupStore
from .stores._records import Commit, CommitStatus, Marker, State, StateStatus

# The marker is there: its outbox is due.
_COMMITTED = frozenset({Outcome.PROCESSED, Outcome.DECLINED, Outcome.DUPLICATE})
_REFUSALS = frozenset({Outcome.INVALID, Outcome.CONFLICT})  # recorded as dead letters before acknowledging

Handler = Callable[[Any, Context], Effects | LatestState]
"""Decides the entities to commit with the marker (or the latest state to apply);
effects outside the transaction go through ``context.step`` (two-phase). Do not catch
broad exceptions around a step: its errors (in flight, mismatch, lease lost) are the
flow's to settle."""

_STATE_OUTCOMES = {StateStatus.APPLIED: Outcome.PROCESSED, StateStatus.SAME: Outcome.DUPLICATE,
                   StateStatus.STALE: Outcome.STALE}  # fmt: skip


def _fingerprint(delivery: Delivery, payload: Any) -> str:
    return fingerprint(payload if delivery.origin is None else {"origin": delivery.origin, "payload": payload})


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
        partition_from: KeySource | None = None,
        reads: Callable[[Any], Iterable[str]] | None = None,
        replay_results: bool = False,
        record_refusals: bool = True,
        bind_request_keys: bool = False,
        sender: Sender | None = None,
    ) -> None:
        """``config``: retention, step lease and wait, cache size; by default the app settings
        (``DedupConfig.from_settings()``, as the README documents them). ``replay_results``: a
        duplicate reads the stored result back (one more read, for duplicates only): HTTP needs
        it. ``record_refusals``: invalid and conflicting messages are written to the dead-letter
        records before they are acknowledged: a queue needs it, HTTP tells its caller instead.
        ``bind_request_keys``: ``message_id`` is the caller's request key (``Idempotency-Key``)
        while ``key_source`` keys by the body: each request key is bound to its payload (one
        conditional insert), so a key reused with another payload is refused
        (``idempotency_key_reused``, HTTP 422), and a new key for a known payload still replays.
        ``sender``: sends ``Effects.messages`` (the outbox: committed with the marker, sent after
        the commit and again on duplicates until sent). The cache keeps keys this instance saw
        completed: hot duplicates cost no store request; never trusted to decide "new".
        ``partition_from``: the partition the business data lives in, taken from the message
        (``from_body_field("accountId")``) rather than from its key (``partition_for``): the key is
        then pinned to its first partition (one conditional insert per new message), and the same
        key under another partition is a conflict. ``reads``: the entities a handler reads
        (``context.read``) and may change (``Effects.changes``), read with the message's marker in
        one request: a duplicate costs that request, and never runs the handler."""
        config = config or DedupConfig.from_settings()
        if not name or "|" in name or name.startswith("~"):
            raise ValueError(f"consumer name {name!r}: non-empty, without '|', not starting with '~' (the library's)")
        self.name = name
        self.store = store
        self._handler = handler
        self._key_source = key_source
        self._validator = Draft202012Validator(schema) if schema is not None else None
        self._retention = config.retention
        self._margin = min(EXPIRY_MARGIN, config.retention / 2)  # a message older than retention less it: refused
        self._steps = config.steps
        self._partition_for = partition_for
        self._partition_from = partition_from
        self._reads = reads
        if reads is not None and not store.commits_changes:
            raise ValueError(f"consumer {name!r} reads entities to change them: {type(store).__name__} "
                             "cannot commit changes (commits_changes)")  # fmt: skip
        self._replay = replay_results
        self._record_refusals = record_refusals
        self._bind_request_keys = bind_request_keys
        self._completed = CompletedKeys(0 if replay_results else config.cache_size)  # replays need the result
        self._transient_wait = config.transient_wait
        self._max_deliveries = config.max_deliveries
        self.sender = sender
        self._sweep_delay = config.outbox_sweep_delay

    @property
    def retention(self) -> timedelta:
        """How long its markers are kept (DEDUP_RETENTION, or its ``config``'s)."""
        return self._retention

    def identify(self, delivery: Delivery) -> tuple[DedupKey, str, str]:
        """Key, partition and fingerprint as processing derives them, or InvalidMessage
        when processing would dead-letter the message; touches no store."""
        payload, key, fp = self._read(delivery)
        self._validate(payload)
        return key, self.partition_of(key, payload), fp

    def _read(self, delivery: Delivery) -> tuple[Any, DedupKey, str]:
        payload = parse_json(delivery.body)
        key = DedupKey(self.name, self._key_source(delivery.message_id, payload) or "")
        return payload, key, _fingerprint(delivery, payload)

    def outbox(self, sender: Sender) -> Outbox:
        """Its outbox, on its store (as it is now: tools may swap the store) and ``sender``."""
        return Outbox(self.store, sender, sweep_delay=self._sweep_delay)

    def partition_of(self, key: DedupKey, payload: Any = None) -> str:
        """The partition of a message's marker and data: from its key (``partition_for``), or from
        the message (``partition_from``; given the key only, the partition the key is pinned to)."""
        if self._partition_from is None:
            return consumer_partition(self.name, self._partition_for(key))
        if payload is None:
            pin = self.store.get(*self._pin_place(key))
            return pin.fingerprint if pin else self._pin_place(key)[1]
        partition = self._partition_from(None, payload)
        if not partition:
            raise InvalidMessage(Reason.MISSING_KEY, "the message names no partition (the consumer's partition_from)")
        return consumer_partition(self.name, partition)

    def _pin_place(self, key: DedupKey) -> tuple[DedupKey, str]:
        """Where a key's pin lives: a scope of its own, a partition derived from the key alone."""
        return DedupKey(f"{self.name}|partition", key.id), consumer_partition(self.name, "key|" + key.id)

    def _pin(self, key: DedupKey, partition: str, fp: str, expires_at: datetime) -> Result | None:
        """Pin a key to its partition: the first one wins (a conditional insert); the same key
        under another partition is a conflict, never a second application elsewhere."""
        pin_key, place = self._pin_place(key)
        if self.store.insert(Marker(pin_key, place, State.COMPLETED, partition, utcnow(), expires_at)) is not None:
            return None
        pinned = self.store.get(pin_key, place)
        if pinned is None or pinned.fingerprint == partition:
            return None
        detail = f"the key was processed under another partition ({pinned.fingerprint.split('|', 1)[-1]!r})"
        return Result(Outcome.CONFLICT, key, Reason.KEY_PARTITION_MISMATCH, detail[:500], fingerprint=fp)

    def process(self, delivery: Delivery) -> Result:
        return self.process_batch([delivery])[0]

    def process_batch(self, deliveries: Sequence[Delivery]) -> list[Result]:
        """Each message is decided on its own; the commits of those that share a
        partition go to the store together (``commit_many``: on Table Storage, up to 100
        operations per transaction), and a conflict isolates only its own message.
        A transient failure is tried again until the delivery's wait runs out (``wait``);
        on the broker's last delivery, what still fails is recorded as a dead letter with
        its reason before the broker takes the message."""
        started = time.perf_counter()
        patience = self._patience(deliveries)
        spans = [telemetry.span(self.name, d) for d in deliveries]
        # Each delivery's token: its claims and its marker carry it, so a retry knows its own writes.
        tries = [(d, span, f"{random.getrandbits(128):032x}") for d, span in zip(deliveries, spans, strict=True)]
        dispatch = None if self.sender is None else Dispatch(self.outbox(self.sender), self._max_deliveries,
                                                             self._completed.put)  # fmt: skip
        try:
            results = wait.within(patience, len(tries), lambda at, again: self._attempt([tries[i] for i in at],
                                                                                        dispatch, again))  # fmt: skip
            for delivery, result, span in zip(deliveries, results, spans, strict=True):
                if result.outcome in RETRY_OUTCOMES and delivery.is_last(self._max_deliveries):
                    if self._record_refusals:  # the broker dead-letters it next: say why
                        dead_letters.record(self.store, self.name, delivery, result)
                    if dispatch is not None and result.key is not None and not dispatch.left(result.key):
                        dispatch.leave(result.key, self.partition_of(result.key, _payload(delivery)))
                telemetry.record(self.name, delivery, result, (time.perf_counter() - started) * 1000, span)
                if result.outcome in _COMMITTED and facts.is_canary(delivery):
                    canary.seen(self.name, delivery)
        finally:
            for span in spans:
                span.end()
        return results

    def _attempt(self, tries: Sequence[tuple[Delivery, trace.Span, str]], dispatch: Dispatch | None,
                 retry: bool) -> list[Result]:  # fmt: skip
        decided = []
        siblings: dict[DedupKey, Context] = {}  # the steps whose completion a decided message holds
        views = self._views([delivery for delivery, _, _ in tries], retry)  # per partition: what its messages read
        for delivery, span, owner in tries:
            current = otel_context.attach(trace.set_span_in_context(span))  # while its handler runs: a parent
            try:  # (use_span's work, without its generator: _decide raises nothing to record)
                decided.append(self._decide(delivery, owner, retry, dispatch, siblings, views))
            finally:
                otel_context.detach(current)
        # A completion a later copy of the same message wrote already (it met the claim) no
        # longer rides with the commit: the claim's version it is fenced by has moved.
        decided = [item._replace(completions=tuple(c for c in item.completions if c.key in siblings))
                   if isinstance(item, Commit) and item.completions else item for item in decided]  # fmt: skip
        committed = iter(self._commit([item for item in decided if isinstance(item, Commit)]))
        results = []
        for (delivery, _, _), item in zip(tries, decided, strict=True):
            result = next(committed) if isinstance(item, Commit) else item
            if dispatch is not None and isinstance(item, Commit) and result.outcome in _COMMITTED:
                result = dispatch.send(delivery, item, result, retry=retry)
            if result.outcome is Outcome.DUPLICATE and delivery.sequence is not None:
                result = self._seen(delivery, result)
            if result.outcome is Outcome.CONFLICT and delivery.origin is not None:
                result = _reused(delivery, result)
            if self._record_refusals and result.outcome in _REFUSALS:
                result = dead_letters.record(self.store, self.name, delivery, result)
            results.append(result)
        return results

    def _views(self, deliveries: Sequence[Delivery], retry: bool) -> dict[str, PartitionView | DedupError]:
        """For a consumer with ``reads``: each partition's markers and entities its messages read,
        one ``read_current`` per partition (or the error that read met); else an empty view per
        partition, filled as its handlers read. The markers are read with the entities when they
        fit the same request (a message, a small batch), or when the messages may have been
        committed already (a redelivery, a retry); else a batch's fresh messages are told from
        duplicates by the commit itself (a marker is a conditional insert)."""
        views: dict[str, PartitionView | DedupError] = _Views(self.store)
        if self._reads is None:
            return views
        wanted: dict[str, tuple[dict[DedupKey, None], dict[str, None]]] = {}
        for delivery in deliveries:
            try:
                payload, key, _ = self._read(delivery)
                self._validate(payload)
                keys, names = wanted.setdefault(self.partition_of(key, payload), ({}, {}))
                keys[key] = None
                names.update(dict.fromkeys(self._reads(payload)))
            except Exception:  # noqa: BLE001 - decided (refused) with its reason by _decide
                continue
        again = retry or any((d.delivery_count or 1) > 1 for d in deliveries)
        for partition, (keys, names) in wanted.items():
            markers = [*keys] if again or len(keys) + len(names) <= self.store.rows_per_read else []
            try:
                current = self.store.read_current(partition, markers, [*names])
                views[partition] = PartitionView(self.store, partition, current, markers)
            except DedupError as exc:
                views[partition] = exc
        return views

    def _decide(self, delivery: Delivery, owner: str, retry: bool, dispatch: Dispatch | None,
                siblings: dict[DedupKey, Context] | None = None,
                views: dict[str, PartitionView | DedupError] | None = None) -> Result | Commit:  # fmt: skip
        """Everything up to the commit: parse, key, validate, fingerprint, the cache of
        completed keys, the marker read with the entities the handler reads, then the handler
        (and its two-phase steps)."""
        key: DedupKey | None = None
        fp: str | None = None
        context: Context | None = None
        try:
            if facts.is_canary(delivery):  # no business: its marker is its heartbeat, and the audit's fact
                key = facts.canary_key(self.name, delivery)
                return Commit(key, consumer_partition(key.scope, key.id), "canary", [], None,
                              utcnow() + self._retention, owner, retry, sequence=delivery.sequence,
                              enqueued_at=delivery.enqueued_at)  # fmt: skip
            payload, key, fp = self._read(delivery)
            self._validate(payload)
            self._check_age(delivery)
            partition, expires_at = self.partition_of(key, payload), utcnow() + self._retention
            if self._bind_request_keys and delivery.message_id:  # before anything answers: a reused key is 422
                self._bind(delivery.message_id, fp, expires_at)
            if not retry and self._completed.get(key) == fp:  # a retry may find its own commit: the store tells
                return Result(Outcome.DUPLICATE, key, Reason.COMPLETED_RECENTLY, fingerprint=fp, stored_fingerprint=fp)
            view = (views if views is not None else _Views(self.store))[partition]
            if isinstance(view, DedupError):
                raise view
            known = view.markers.get(key)
            if known is not None and known.final:  # found with the entities read: decided without the handler
                return self._known(delivery, Commit(key, partition, fp, [], None, expires_at), owner, known, dispatch)
            pinned = self._partition_from is None or known is not None
            if not pinned and (clash := self._pin(key, partition, fp, expires_at)) is not None:
                return clash
            context = Context(key, partition, fp, self.store, self._steps, expires_at, owner, siblings, view)
            try:
                effects = self._handler(payload, context)
            except Exception as exc:  # its marker may say it was decided: read with an entity, or now
                decided = exc.marker if isinstance(exc, AlreadyDecided) else self._decided(view, key, partition, exc)
                if decided is None:
                    raise
                context.settle()
                return self._known(delivery, Commit(key, partition, fp, [], None, expires_at), owner, decided, dispatch)
            if isinstance(effects, LatestState):
                context.settle()
                status = self.store.upsert_if_newer(partition, effects.entity, effects.version, owner=owner)
                if status is StateStatus.CONFLICT:  # recorded as a dead letter and alerted, as any conflict
                    detail = f"version {effects.version} is already applied with other data; the stored state is kept"
                    return Result(Outcome.CONFLICT, key, Reason.VERSION_CONFLICT, detail, fingerprint=fp)
                return Result(_STATE_OUTCOMES[status], key, response=effects.result, fingerprint=fp)
            if not isinstance(effects, Effects):
                raise InvalidMessage(Reason.HANDLER_RESULT, f"the handler returned {type(effects).__name__}, "
                                     "not Effects or LatestState")  # fmt: skip
            steps = context.completions
            changed = len({change.name for change in effects.changes})  # each written once, beside the effects
            if len(effects.entities) + len(effects.messages) + changed + len(steps) > self.store.max_effects:
                raise InvalidMessage(Reason.TOO_MANY_EFFECTS, f"{len(effects.entities)} entities, "
                                     f"{len(effects.messages)} outgoing messages, {changed} changed entities "
                                     f"and {len(steps)} steps; one commit holds {self.store.max_effects}")  # fmt: skip
            check_result(effects.result, "the handler's result")
            state, result = State.COMPLETED, effects.result
            if effects.declined is not None:
                if effects.result is not None:
                    raise InvalidMessage(Reason.HANDLER_RESULT, "a declined message's result is its decline "
                                         "(Effects.declined): Effects.result must be None")  # fmt: skip
                state, result = State.DECLINED, effects.declined.result
                check_result(result, "the decline")
            entities = list(effects.entities)
            if effects.messages:
                if dispatch is None:
                    raise ValueError(f"consumer {self.name!r} has no sender for the handler's outgoing messages")
                entities += dispatch.rows(delivery, key, partition, effects.messages)
            changes = view.fold(effects.changes) if effects.changes else ()
            if changes or state is State.DECLINED:  # what a later copy in this attempt finds
                view.markers[key] = Commit(key, partition, fp, [], result, expires_at, state=state).marker(utcnow())
            return Commit(key, partition, fp, entities, result, expires_at, owner, retry, steps, changes,
                          delivery.sequence, delivery.enqueued_at, state, delivery.origin)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - mapped to exactly one outcome below
            if context is not None:
                context.settle()  # the steps it called stay completed
            return failure(exc, key, fp)

    def _known(self, delivery: Delivery, at: Commit, owner: str, known: Marker, dispatch: Dispatch | None) -> Result:
        """A message whose final marker was read before its handler decided (``at``: its key,
        partition and fingerprint): this delivery's own commit (its answer lost: applied, as it
        was committed), a duplicate, or a twin. Its outgoing messages are sent as a commit's."""
        key, fp = at.key, at.fingerprint
        if known.fingerprint != fp:
            return mismatch(key, fp, known.fingerprint)
        if known.version is None:  # an earlier copy's of this attempt, not read back: it sends them
            return self._replayed(key, fp, known)
        ours = known.owner == owner
        result = _applied(key, fp, known.state, known.result) if ours else self._replayed(key, fp, known)
        if dispatch is not None:  # the cache learns the key once they are sent
            return dispatch.send(delivery, at, result, retry=True)
        self._completed.put(key, fp)
        return result

    def _decided(self, view: PartitionView, key: DedupKey, partition: str, exc: Exception) -> Marker | None:
        """A handler that raised may have met the state its message's own earlier commit left
        (in a batch whose markers were not read, an entity another message of it read first): its
        marker, read now — on this failure path only — unless it was read already."""
        if view.knows(key) or (isinstance(exc, DedupError) and not isinstance(exc, InvalidMessage)):
            return None  # read already; or the store's, a step's: about neither the state nor the message
        try:
            found = self.store.get(key, partition)
        except DedupError:
            return None
        return found if found is not None and found.final else None

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
            raise InvalidMessage(Reason.IDEMPOTENCY_KEY_REUSED, "this Idempotency-Key was sent with another payload")

    def _commit(self, pending: list[Commit]) -> list[Result]:
        if not pending:
            return []
        claiming = time.perf_counter()
        try:
            commits = self.store.commit_many(pending)
        except DedupError as exc:  # not about one message's data (that is CommitStatus.REFUSED): all wait
            for item in pending:
                settle(self.store, item.completions)
            return [Result(Outcome.TRANSIENT, p.key, Reason.STORE_UNAVAILABLE, str(exc)[:500]) for p in pending]
        except Exception as exc:  # noqa: BLE001 - a bug: all retry
            for item in pending:
                settle(self.store, item.completions)
            return [failure(exc, p.key, p.fingerprint) for p in pending]
        per_message = (time.perf_counter() - claiming) * 1000 / len(pending)
        results = []
        for item, commit in zip(pending, commits, strict=True):
            telemetry.claim_duration(self.name, per_message)
            if commit.status is CommitStatus.LEASE_LOST:
                results.append(Result(Outcome.TRANSIENT, item.key, Reason.LEASE_LOST, "a step's claim was taken over"))
                continue
            if commit.status is CommitStatus.CONTENDED:
                settle(self.store, item.completions)
                telemetry.contended(self.name, item.key.id)
                results.append(Result(Outcome.TRANSIENT, item.key, Reason.CONTENDED,
                                      "an entity it changes moved since it was read: decided again"))  # fmt: skip
                continue
            if commit.status is not CommitStatus.NEW:  # its steps' completions were not written
                settle(self.store, item.completions)
            if commit.status is CommitStatus.MISMATCH:
                results.append(mismatch(item.key, item.fingerprint, commit.stored_fingerprint))
                continue
            if commit.status is CommitStatus.REFUSED:
                results.append(Result(Outcome.INVALID, item.key, Reason.STORE_REFUSED, commit.detail))
                continue
            if self.sender is None:  # else once its outgoing messages are sent (Dispatch.send)
                self._completed.put(item.key, item.fingerprint)
            if commit.status is CommitStatus.NEW:  # as committed: by this attempt, or read back (an earlier one's)
                done = commit.stored or item.marker(utcnow())
                results.append(_applied(item.key, item.fingerprint, done.state, done.result))
            else:
                results.append(self._duplicate(item.key, item.partition, item.fingerprint, commit.stored_fingerprint))
        return results

    def _seen(self, delivery: Delivery, result: Result) -> Result:
        """A duplicate's own delivery, kept for the audit (one small insert); when it cannot be
        kept, the broker keeps the message: the audit would count it lost."""
        try:
            facts.record_duplicate(self.store, self.name, delivery, result, utcnow() + self._retention)
        except DedupError as exc:
            return Result(Outcome.TRANSIENT, result.key, Reason.STORE_UNAVAILABLE, str(exc)[:500])
        return result

    def _duplicate(self, key: DedupKey, partition: str, fp: str, stored_fp: str | None) -> Result:
        if not self._replay:
            return Result(Outcome.DUPLICATE, key, fingerprint=fp, stored_fingerprint=stored_fp)
        try:
            stored = self.store.get(key, partition)
        except DedupError as exc:  # the replay could not be read: wait and try again
            return Result(Outcome.TRANSIENT, key, Reason.STORE_UNAVAILABLE, str(exc)[:500])
        return self._replayed(key, fp, stored, stored_fp)

    def _replayed(self, key: DedupKey, fp: str, stored: Marker | None, stored_fp: str | None = None) -> Result:
        """A duplicate, with what its marker holds: a declined message's decline (reason
        ``declined``) always, the stored result when the consumer replays results."""
        declined = stored is not None and stored.state is State.DECLINED
        response = stored.result if stored is not None and (self._replay or declined) else None
        return Result(Outcome.DUPLICATE, key, Reason.DECLINED if declined else None, response=response,
                      fingerprint=fp, stored_fingerprint=stored_fp or fp, declined=declined)  # fmt: skip

    def _check_age(self, delivery: Delivery) -> None:
        """Fail closed: a message first enqueued longer ago than its marker is sure to be kept
        (``DEDUP_RETENTION`` less ``EXPIRY_MARGIN``) may have been applied and its marker purged
        since, so it is refused (``expired``), never applied a second time."""
        enqueued = min(filter(None, (delivery.first_enqueued_at, delivery.enqueued_at)), default=None)
        if enqueued is not None and enqueued <= utcnow() - self._retention + self._margin:
            raise InvalidMessage(Reason.EXPIRED, f"first enqueued {enqueued.isoformat(timespec='seconds')}: older "
                                 f"than DEDUP_RETENTION ({self._retention}) less {self._margin}, so its marker "
                                 "may be purged: never applied (if it is new, send it as a new message)")  # fmt: skip

    def _validate(self, payload: Any) -> None:
        if self._validator is None:
            return
        error = best_match(self._validator.iter_errors(payload))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(root)"
            raise InvalidMessage(Reason.SCHEMA_VIOLATION, f"{where}: {error.message[:400]}")

    def park(self, failing: Sequence[tuple[Delivery, Result]]) -> list[Result]:
        """Keep messages their source will not deliver again, for replay; those the store
        refuses are tried again for a moment (``dead_letters.park``)."""
        return dead_letters.park(self.store, self.name, failing, self._patience([d for d, _ in failing]))

    def _patience(self, deliveries: Sequence[Delivery]) -> timedelta:
        """How long these deliveries may wait for a transient failure to clear: the shortest wait."""
        return min((self._transient_wait if d.wait is None else d.wait for d in deliveries), default=timedelta(0))


class _Views(dict[str, "PartitionView | DedupError"]):
    """Each partition's view, made empty on first use (a handler that reads without ``reads``)."""

    def __init__(self, store: DedupStore) -> None:
        super().__init__()
        self._store = store

    def __missing__(self, partition: str) -> PartitionView:
        view = self[partition] = PartitionView(self._store, partition)
        return view


def _applied(key: DedupKey, fp: str, state: State, result: Any) -> Result:
    """The outcome of the delivery whose commit applied, from what was committed: processed,
    or declined with the decline's reason and detail."""
    if state is State.DECLINED:
        decline = Declined.of(result)
        return Result(Outcome.DECLINED, key, decline.reason, decline.detail, response=result, fingerprint=fp,
                      declined=True)  # fmt: skip
    return Result(Outcome.PROCESSED, key, response=result, fingerprint=fp)


def _reused(delivery: Delivery, result: Result) -> Result:
    """A key an HTTP caller sent (its request's) reused with another body: the caller's doing,
    told to the caller (``functions.refusal``) and counted as invalid — never a ``conflict``, whose
    alert is for twins a broker delivers. Where the key is the caller's own request key, the
    caller reused its key (``idempotency_key_reused``)."""
    own = result.reason == Reason.FINGERPRINT_MISMATCH and result.key is not None and (
        result.key.id == delivery.message_id)  # fmt: skip
    return replace(result, outcome=Outcome.INVALID, reason=Reason.IDEMPOTENCY_KEY_REUSED if own else result.reason)


def _payload(delivery: Delivery) -> Any:
    try:
        return parse_json(delivery.body)
    except InvalidMessage:
        return None
