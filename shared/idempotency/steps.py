"""Effects that cannot join the transaction (a payment API, an e-mail): two phases per
step. Claim the step *in progress* with a lease, make the call with a downstream
idempotency key, then mark it *completed* with its result — every write fenced by the
marker's version, so a worker whose lease was taken over can never complete it.

On a store that folds completions (``DedupStore.folds_completions``: Table Storage and
memory; Cosmos DB completes each step on its own), the completion is not a request of its
own: it commits in the message's transaction, with its marker and effects (2 requests per
message with a step: the claim, then the commit). Whenever the message does not commit (the
handler failed, a duplicate, an unavailable store), ``settle`` completes the steps one by
one, as before."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from .config import StepPolicy
from .errors import (
    AlreadyClaimed,
    DedupError,
    DownstreamRejected,
    FingerprintMismatch,
    InFlight,
    InvalidMessage,
    LeaseLost,
    VersionConflict,
)
from .keys import DedupKey
from .messages import JSON, Stored, check_result, utcnow
from .stored import PartitionView
from .stores._base import DedupStore
from .stores._records import Marker, State

log = logging.getLogger("idempotency")


class Context:
    """What a handler gets besides the payload: the message's key, and ``step`` for
    effects outside the transaction."""

    def __init__(
        self,
        key: DedupKey,
        partition: str,
        fingerprint: str,
        store: DedupStore,
        policy: StepPolicy,
        expires_at: datetime,
        owner: str | None = None,
        siblings: dict[DedupKey, Context] | None = None,
        view: PartitionView | None = None,
    ) -> None:
        """``siblings``: the contexts of the other messages decided in the same attempt (a
        batch), by the step keys whose completion each holds, shared among them. ``view``: what
        the messages of its partition read in this attempt (``stored.PartitionView``)."""
        self.key = key
        self._partition = partition
        self._fingerprint = fingerprint
        self._store = store
        self._policy = policy
        self._expires_at = expires_at
        # This delivery's identity as a claim owner (the consumer's token for the delivery):
        # 128 bits from the process's generator (seeded from the OS, reseeded in a forked
        # child), not uuid4's system call per message.
        self._owner = owner or f"{random.getrandbits(128):032x}"
        self._done: dict[str, tuple[Marker, JSON]] = {}  # by name: steps called (claim, result), not completed yet
        self._siblings = {} if siblings is None else siblings
        self.view = view or PartitionView(store, partition)

    @property
    def fingerprint(self) -> str:
        """The payload's fingerprint (``payload.fingerprint``), as the marker keeps it."""
        return self._fingerprint

    def read(self, name: str) -> Stored:
        """Entity ``name`` of the message's partition, as stored (``Stored.data`` None when there
        is none) or as an earlier message of the same batch left it; its ``replaced``, ``merged``
        or ``deleted`` in ``Effects.changes`` commit with the marker only if it is still as read.
        The consumer's ``reads`` names are read with the marker, in the same request; another
        costs one request more (and reads the message's marker with it: a message decided already
        stops its handler there, decided as before)."""
        return self.view.read(name, self.key)

    def step(self, name: str, call: Callable[[str], JSON],
             reconcile: Callable[[str], JSON] | None = None) -> JSON:  # fmt: skip
        """Run ``call(idempotency_key)`` at most once to completion for (consumer,
        message, step), and return its (JSON) result; a redelivery that finds the step
        completed gets the stored result back without calling again.

        ``reconcile(idempotency_key)``, for a service that does not honour the key: asked
        first when this delivery resumes the step from an earlier attempt that did not
        complete it (``Marker.resumed``), which may have made the call. It returns the
        call's result when the service has it (the call is not made again; so a call whose
        result is None needs another, e.g. ``{}``), None when it has not (the call is made).
        Any exception it raises leaves the step in progress, never refused: an
        ``InvalidMessage`` (or ``DownstreamRejected``) escalates to an operator — the message
        is dead-lettered with its reason; another is retried as any failure."""
        if name in self._done:  # called already in this delivery: its completion is pending
            return self._done[name][1]
        key = self.key.for_step(name)
        holder = self._siblings.pop(key, None)
        if holder is not None:  # a copy of this message earlier in the batch holds its completion
            holder._settle_step(name)  # written now, rather than our wait for its claim
        claimed = self._claim(key)
        if claimed.state is State.COMPLETED:
            return claimed.result
        if claimed.state is State.REFUSED:  # known: refused for good, never called again
            refusal = claimed.result
            if "reason" in refusal:
                raise InvalidMessage(str(refusal["reason"]), str(refusal["detail"]))
            raise DownstreamRejected(int(refusal["status"]), str(refusal["detail"]))
        try:  # a lookup's refusal is not the call's: the step stays in progress
            found = reconcile(key.downstream_key) if reconcile is not None and claimed.resumed else None
        except Exception:
            self._end_lease(claimed)
            raise
        try:
            result = call(key.downstream_key) if found is None else found
        except DownstreamRejected as refused:
            self._complete(claimed, {"status": refused.status, "detail": refused.detail}, State.REFUSED)
            raise
        except Exception:
            self._end_lease(claimed)
            raise
        try:
            check_result(result, f"step {name!r}'s result")
        except InvalidMessage as unstorable:  # the call was made: never repeat it, tell an operator
            self._complete(claimed, {"reason": unstorable.reason, "detail": unstorable.detail}, State.REFUSED)
            raise
        if self._store.folds_completions:
            self._done[name] = (claimed, result)
            self._siblings[key] = self
            return result
        return self._complete(claimed, result)

    @property
    def completions(self) -> tuple[Marker, ...]:
        """Completed steps whose completion commits with the message (each at its claim's version)."""
        return tuple(claimed.finished(result) for claimed, result in self._done.values())

    def settle(self) -> None:
        """The message will not commit now: write the pending completions one by one."""
        done, self._done = self.completions, {}
        settle(self._store, done)

    def _settle_step(self, name: str) -> None:
        pending = self._done.pop(name, None)
        if pending is not None:
            claimed, result = pending
            settle(self._store, [claimed.finished(result)])

    def _claim(self, key: DedupKey) -> Marker:
        deadline = time.monotonic() + self._policy.in_flight_wait.total_seconds()
        pause = 0.1
        while True:
            now = utcnow()
            marker = Marker(key, self._partition, State.IN_PROGRESS, self._fingerprint, now, self._expires_at,
                            lease_until=now + self._policy.lease, owner=self._owner)  # fmt: skip
            try:
                return self._store.claim(marker, now)
            except AlreadyClaimed as exc:
                existing = exc.existing
            if isinstance(existing, Marker):
                if existing.fingerprint != self._fingerprint:
                    raise FingerprintMismatch(existing.fingerprint)
                if existing.final:
                    return existing
            left = deadline - time.monotonic()
            if left <= 0:
                raise InFlight(existing)
            time.sleep(min(pause, left))  # the last attempt comes at the deadline: the whole wait counts
            pause = min(pause * 2, 2.0)

    def _complete(self, claimed: Marker, result: JSON, state: State = State.COMPLETED) -> JSON:
        try:
            self._store.complete(claimed, result, state)
        except VersionConflict:
            # Either our completion was applied and its response lost (we still own it),
            # or another delivery took the claim over: then it owns the step, not us.
            current = self._store.get(claimed.key, claimed.partition)
            if current is None or current.owner != self._owner or current.state is not state:
                raise LeaseLost(str(claimed.key)) from None
        return result

    def _end_lease(self, claimed: Marker) -> None:
        """After a failed call, let the next delivery take over at once (same key
        downstream) — but keep the marker: it still binds the key to this payload's
        fingerprint, so a different payload is refused here, not by the service."""
        try:
            self._store.replace(replace(claimed, lease_until=utcnow()), claimed.version or "")
        except VersionConflict:
            log.warning("dedup claim %r was taken over before its lease ended", str(claimed.key))


def settle(store: DedupStore, completions: Sequence[Marker]) -> None:
    """Write completions one by one, each at its claim's version, because the message's
    commit did not carry them: a redelivery then finds its steps completed instead of a
    claim waiting for its lease. Best effort: a claim left in progress is taken over after
    its lease, and the call made again with the same downstream key."""
    for done in completions:
        try:
            store.replace(done, done.version or "")
        except DedupError as exc:
            log.warning("dedup step %r not completed: %s", str(done.key), exc)
