"""The idempotent-consumer flow. Trigger-neutral: a trigger turns its binding into a
Delivery, calls ``process`` and settles the returned Result (see shared/bindings.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from . import telemetry
from .errors import (
    DownstreamRejected,
    DownstreamUnavailable,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    StoreUnavailable,
)
from .fingerprint import fingerprint
from .keys import DedupKey, KeySource, from_message_id
from .records import JSON, Entity, utcnow
from .steps import DEFAULT_STEPS, Context, StepPolicy
from .store import CommitStatus, DeadLetter, DedupStore, StateStatus

log = logging.getLogger("idempotency")


class Outcome(StrEnum):
    PROCESSED = "processed"  # effects committed with the marker, now
    DUPLICATE = "duplicate"  # same key, same payload: nothing written, acknowledge
    IN_FLIGHT = "in_flight"  # another delivery holds a live claim: retry later
    CONFLICT = "conflict"  # same key, different payload: dead-lettered, alert raised
    INVALID = "invalid"  # can never be processed as sent: dead-lettered with reason
    TRANSIENT = "transient"  # nothing committed: let the broker redeliver
    STALE = "stale"  # an older version of state already superseded: acknowledge


RETRY_OUTCOMES = frozenset({Outcome.IN_FLIGHT, Outcome.TRANSIENT})


@dataclass(frozen=True)
class Delivery:
    """One delivery of a message, whatever the trigger. Only ``message_id`` (producer
    assigned) may feed the key; the rest is for logs and operators."""

    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    key: DedupKey | None = None
    reason: str | None = None
    detail: str | None = None
    result: JSON = None
    fingerprint: str | None = None
    stored_fingerprint: str | None = None

    @property
    def acknowledge(self) -> bool:
        """False: the trigger must make the broker redeliver (abandon / raise)."""
        return self.outcome not in RETRY_OUTCOMES


@dataclass(frozen=True)
class Effects:
    """What a handler decides for one new message: the business entities to commit with
    the marker (one transaction) and the result to store for replays."""

    entities: list[Entity]
    result: JSON = None


@dataclass(frozen=True)
class LatestState:
    """Event-carried state transfer: the message holds the absolute state and its version.
    Applying it is naturally idempotent — written only when newer — so no dedup marker
    is written at all. Prefer this wherever the message can carry the whole state."""

    entity: Entity
    version: int
    result: JSON = None


Handler = Callable[[Any, Context], Effects | LatestState]
"""Decides the entities to commit with the marker (or the latest state to apply);
effects outside the transaction go through ``context.step`` (two-phase). Do not catch
broad exceptions around a step: its errors (in flight, mismatch, lease lost) are the
flow's to settle."""

_STATE_OUTCOMES = {StateStatus.APPLIED: Outcome.PROCESSED, StateStatus.SAME: Outcome.DUPLICATE,
                   StateStatus.STALE: Outcome.STALE}  # fmt: skip


def parse_json(body: bytes) -> Any:
    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(body.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidMessage("invalid_json", str(exc)[:500]) from exc


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
        retention: timedelta = timedelta(days=30),
        steps: StepPolicy = DEFAULT_STEPS,
        partition_for: Callable[[DedupKey], str] = lambda key: key.id,
        replay_results: bool = False,
        record_refusals: bool = True,
    ) -> None:
        """``replay_results``: a duplicate reads the stored result back (one more read,
        for duplicates only) — HTTP needs it, a queue does not. ``record_refusals``:
        invalid and conflicting messages are written to the dead-letter records before
        they are acknowledged — a queue needs it, HTTP tells its caller instead."""
        self.name = name
        self.store = store
        self._handler = handler
        self._key_source = key_source
        self._validator = Draft202012Validator(schema) if schema is not None else None
        self._retention = retention
        self._steps = steps
        self._partition_for = partition_for
        self._replay = replay_results
        self._record_refusals = record_refusals

    def process(self, delivery: Delivery) -> Result:
        started = time.perf_counter()
        result = self._process(delivery)
        if self._record_refusals and result.outcome in (Outcome.INVALID, Outcome.CONFLICT):
            result = self._dead_letter(delivery, result)
        telemetry.record(self.name, delivery, result, (time.perf_counter() - started) * 1000)
        return result

    def _process(self, delivery: Delivery) -> Result:
        key: DedupKey | None = None
        try:
            payload = parse_json(delivery.body)
            key = DedupKey(self.name, self._key_source(delivery.message_id, payload) or "")
            self._validate(payload)
            fp = fingerprint(payload)
            partition, expires_at = self._partition_for(key), utcnow() + self._retention
            effects = self._handler(payload, Context(key, partition, fp, self.store, self._steps, expires_at))
            if isinstance(effects, LatestState):
                status = self.store.upsert_if_newer(partition, effects.entity, effects.version)
                return Result(_STATE_OUTCOMES[status], key, result=effects.result, fingerprint=fp)
            commit = self.store.commit(key, partition, fp, effects.entities, effects.result, expires_at)
        except InvalidMessage as exc:
            return Result(Outcome.INVALID, key, exc.reason, exc.detail)
        except DownstreamRejected as exc:
            return Result(Outcome.INVALID, key, "downstream_rejected", str(exc)[:500])
        except FingerprintMismatch as exc:
            return self._mismatch(key, fp, exc.stored_fingerprint)
        except InFlight:
            return Result(Outcome.IN_FLIGHT, key, "claimed_elsewhere", "another delivery holds a live claim")
        except (StoreUnavailable, DownstreamUnavailable, LeaseLost) as exc:
            reason = {StoreUnavailable: "store_unavailable", DownstreamUnavailable: "downstream_unavailable"}
            return Result(Outcome.TRANSIENT, key, reason.get(type(exc), "lease_lost"), str(exc)[:500])
        except Exception as exc:  # a handler or store bug: never acknowledge it
            log.exception("dedup handler failed for %s", key)
            return Result(Outcome.TRANSIENT, key, "handler_error", repr(exc)[:500])
        if commit.status is CommitStatus.NEW:
            return Result(Outcome.PROCESSED, key, result=effects.result, fingerprint=fp)
        if commit.status is CommitStatus.DUPLICATE:
            return self._duplicate(key, partition, fp, commit.stored_fingerprint)
        return self._mismatch(key, fp, commit.stored_fingerprint)

    def _duplicate(self, key: DedupKey, partition: str, fp: str, stored_fp: str | None) -> Result:
        if not self._replay:
            return Result(Outcome.DUPLICATE, key, fingerprint=fp, stored_fingerprint=stored_fp)
        try:
            stored = self.store.get(key, partition)
        except StoreUnavailable as exc:
            return Result(Outcome.TRANSIENT, key, "store_unavailable", str(exc)[:500])
        result = stored.result if stored else None
        return Result(Outcome.DUPLICATE, key, result=result, fingerprint=fp, stored_fingerprint=stored_fp)

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
