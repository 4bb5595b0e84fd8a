"""What would resubmitting dead-lettered messages do? Reads the store only, and judges
each message by the consumer's own code, as processing would.

    python -m shared.idempotency.resubmit --consumer orders --ids o-1 o-2
    python -m shared.idempotency.resubmit --consumer orders --bodies dead-letters.jsonl [--message-id-field orderId]

With ids it tells completed / refused / in progress / not processed; with bodies (one JSON
message body per line, as exported from the dead-letter queue) it also runs what processing
runs — key, schema, fingerprint, then the handler — on a store it never writes and a sender
that sends nothing (``DryRun``): a duplicate, a conflict, a message refused again (by the
schema, the handler, a service, the store's check of the values) and one whose handler
fails are each told apart. A step the handler calls that has not run yet is not called:
what it would answer is known only by calling, and the line says so. The store's limits
and the sender's are checked as a commit checks them. The consumer comes from the module that declares
the app's consumers (``--consumers``, default ``consumers``: never the function app
itself), its store from the app settings.

It prints one line per id or body, then a JSON summary; what it cannot do (a setting, the
file, the store, an unknown consumer) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from .cache import CompletedKeys
from .commands import app_consumer, command, consumer_options, one_line_errors, printable
from .consumer import IdempotentConsumer
from .errors import (
    AlreadyClaimed,
    ConfigurationError,
    DedupError,
    InFlight,
    InvalidMessage,
    StoreRefused,
    StoreUnavailable,
)
from .keys import DedupKey
from .messages import Delivery, Entity, Outcome, Outgoing
from .payload import parse_json
from .reasons import Reason
from .stores._base import DedupStore, check_storable, refused
from .stores._records import (
    Commit,
    CommitResult,
    CommitStatus,
    Current,
    DeadLetter,
    Marker,
    State,
    StoredItem,
    StoredState,
)

VERDICTS = {
    "duplicate": "completed with this payload: a resubmit is acknowledged as a duplicate",
    "conflict": "completed with another payload: a resubmit is refused as a conflict",
    "completed": "completed: a resubmit is acknowledged as a duplicate if its payload is the same",
    "declined": "declined by its handler: a resubmit gets the same decline (a duplicate) if its payload is the same",
    "declines": "not processed: a resubmit is declined by its handler, and the decline recorded",
    "in_progress": "in progress (two-phase): a resubmit waits for or takes over the claim",
    "refused": "refused for good downstream: a resubmit is dead-lettered again",
    "new": "not processed: a resubmit is processed",
    "invalid": "refused as sent: a resubmit is dead-lettered again",
    "stale": "an older version than the state stored: a resubmit is acknowledged as stale, not applied",
    "fails": "its processing fails, by a bug or an unavailable call, not a refusal: a resubmit is retried "
    "until its source gives up",
}
BY_ID = "judged by its id only: --bodies also runs its checks and its handler"
UNSTORED = "its handler ran without effects, and the store would hold what it writes"


@dataclass(frozen=True)
class Line:
    key: str
    verdict: str
    reason: str = ""

    def __str__(self) -> str:
        why = f" ({printable(self.reason)})" if self.reason else ""
        return f"{printable(self.key)}\t{self.verdict}\t{VERDICTS[self.verdict]}{why}"


def _state(consumer: IdempotentConsumer, key: DedupKey, partition: str) -> tuple[str, Marker | None]:
    """The message marker's state; without one, what its two-phase steps say (a refused
    step is final, a claimed one is in progress)."""
    marker = consumer.store.get(key, partition)
    if marker is not None:
        return ("in_progress" if marker.claimed else marker.state.value), marker
    steps = {item.key.step for item in consumer.store.scan(partition) if item.key and item.key.id == key.id}
    states = [s.state for s in (consumer.store.get(key.for_step(n), partition) for n in steps if n) if s]
    if State.REFUSED in states:
        return "refused", None
    return ("in_progress" if any(s is not State.COMPLETED for s in states) else "new"), None


def check_ids(consumer: IdempotentConsumer, ids: Iterable[str]) -> list[Line]:
    lines = []
    for message_id in ids:
        try:
            key = DedupKey(consumer.name, message_id)
        except InvalidMessage as exc:
            lines.append(Line(message_id[:60], "invalid", exc.reason))
            continue
        verdict = _state(consumer, key, consumer.partition_of(key))[0]
        lines.append(Line(message_id, verdict, BY_ID if verdict == "new" else ""))
    return lines


def check_bodies(consumer: IdempotentConsumer, bodies: Iterable[bytes], message_id_field: str | None) -> list[Line]:
    """``message_id_field``: the body field holding the message's MessageId, when the DLQ
    export has bodies only (for a consumer keyed by MessageId)."""
    lines = []
    for body in bodies:
        try:
            delivery = Delivery(body=body, message_id=_field(body, message_id_field), wait=timedelta(0))
            key, partition, fp = consumer.identify(delivery)
        except InvalidMessage as exc:
            lines.append(Line(body[:60].decode("utf-8", "replace"), "invalid", f"{exc.reason}: {exc.detail[:200]}"))
            continue
        verdict, marker = _state(consumer, key, partition)
        reason = ""
        if marker is not None and verdict in ("completed", "declined"):
            # as the commit compared it: with its caller's, where an HTTP caller sent it
            committed = fp if marker.origin is None else consumer.identify(replace(delivery, origin=marker.origin))[2]
            verdict = "duplicate" if marker.fingerprint == committed else "conflict"
        elif verdict == "new":
            verdict, reason = dry_run(consumer, delivery)
        lines.append(Line(key.id, verdict, reason))
    return lines


def dry_run(consumer: IdempotentConsumer, delivery: Delivery) -> tuple[str, str]:
    """The verdict and its reason for a message that was never processed, decided by the
    consumer's own ``process`` (its checks, its handler, its commit's checks) on a copy of
    it whose store is never written (``DryRun``) and whose sender sends nothing."""
    dry, store = copy.copy(consumer), DryRun(consumer.store)
    dry.store, dry.sender = store, (_Unsent(consumer.sender) if consumer.sender is not None else None)
    dry._completed = CompletedKeys(0)  # a dry commit completes nothing: never remember it
    result = dry.process(delivery)
    if store.calls:  # whatever the handler did with it: the step would have called out
        return "new", (f"its step {store.calls[0]!r} calls out first, unless a resubmit finds it done: what "
                       "it answers, and what the handler then decides, is known only by calling")  # fmt: skip
    why = f"{result.reason}: {(result.detail or '')[:200]}"
    match result.outcome:
        case Outcome.PROCESSED:
            return "new", UNSTORED
        case Outcome.DECLINED:
            return "declines", why
        case Outcome.DUPLICATE:  # versioned state (LatestState): this version is stored
            return "duplicate", "this version of the state is stored"
        case Outcome.STALE:
            return "stale", ""
        case Outcome.CONFLICT:  # e.g. its key completed under another partition (partition_from)
            return "conflict", why
        case Outcome.IN_FLIGHT:
            return "in_progress", ""
        case Outcome.INVALID:
            return ("refused" if result.reason == Reason.DOWNSTREAM_REJECTED else "invalid"), why
    if result.reason == Reason.STORE_UNAVAILABLE:  # a read failed: no verdict at all
        raise StoreUnavailable(result.detail or "")
    return "fails", why


class _NotCalled(DedupError):
    """Raised from a dry step's claim: the call is not made."""


class _Unsent:
    """The dry run's sender: what a handler sends is checked as the consumer's own sender
    checks it (``check``: what it could never send), never sent."""

    def __init__(self, sender: Any) -> None:
        self._check = getattr(sender, "check", None)

    def check(self, messages: Sequence[Outgoing]) -> None:
        if self._check is not None:
            self._check(messages)

    def send(self, messages: Sequence[Outgoing]) -> None:
        pass


class DryRun(DedupStore):
    """``store`` as a resubmit would meet it, read for real and never written: each write
    answers what ``store`` would from what it holds — a commit the store's own check of its
    values refuses is refused, another is new (unless its marker exists); a step's claim
    returns a step done or refused (the handler then goes on, or is refused, as on a
    redelivery) and stops at a step not done, whose call is never made (``calls``)."""

    def __init__(self, store: DedupStore) -> None:
        self._store = store
        self.max_effects = store.max_effects
        self.folds_completions = store.folds_completions
        self.commits_changes = store.commits_changes
        self.calls: list[str] = []

    # -- reads: the store's ------------------------------------------------------------------

    def get(self, key: DedupKey, partition: str) -> Marker | None:
        return self._store.get(key, partition)

    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        return self._store.stale_claims(lease_expired_before, limit)

    def read_state(self, partition: str, name: str) -> StoredState | None:
        return self._store.read_state(partition, name)

    def dead_letters(self, scope: str) -> list[DeadLetter]:
        return self._store.dead_letters(scope)

    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        return self._store.read_entities(partition, prefix, limit)

    def read_current(self, partition: str, keys: Sequence[DedupKey], names: Sequence[str]) -> Current:
        return self._store.read_current(partition, keys, names)

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        return self._store.scan(partition)

    # -- writes: answered, never made --------------------------------------------------------

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        return [self._commit(commit) for commit in commits]

    def _commit(self, commit: Commit) -> CommitResult:
        try:
            changed = [Entity(change.name, change.data) for change in commit.changes if change.data is not None]
            self._store.check_effects([*commit.effects, *changed])  # what the store checks before it sends anything
        except (TypeError, StoreRefused) as exc:
            return refused(exc)
        if self._store.get(commit.key, commit.partition) is not None:
            return self.conflict(commit, guard_exists=False)
        return CommitResult(CommitStatus.NEW, commit.fingerprint)

    def claim(self, marker: Marker, now: datetime) -> Marker:
        existing = self._store.get(marker.key, marker.partition)
        if existing is not None and (existing.final or existing.fingerprint != marker.fingerprint):
            raise AlreadyClaimed(existing)  # the step's own answer: done, refused, or another payload's
        if existing is not None and not existing.reclaimable(now):
            raise InFlight(existing)
        self.calls.append(marker.key.step)
        raise _NotCalled(f"step {marker.key.step!r} not called: a dry run")

    def insert(self, marker: Marker) -> Marker | None:
        return None if self._store.get(marker.key, marker.partition) is not None else marker

    def replace(self, marker: Marker, if_version: str) -> Marker:
        return marker

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        check_storable([entity])  # TypeError, as every store raises it
        return True

    def put_entity(self, partition: str, entity: Entity) -> None:
        check_storable([entity])

    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        pass

    def dead_letter(self, record: DeadLetter) -> None:
        pass


def _field(body: bytes, name: str | None) -> str | None:
    if name is None:
        return None
    payload = parse_json(body)
    value = payload.get(name) if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def main(argv: list[str] | None = None) -> int:
    parser = command("shared.idempotency.resubmit", __doc__)
    consumer_options(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", nargs="+", help="message ids (the dedup keys)")
    source.add_argument(
        "--bodies", help="a file of message bodies, one JSON document per line (dead_letter_records --export)"
    )
    parser.add_argument("--message-id-field", help="with --bodies: the body field that holds the MessageId")
    args = parser.parse_args(argv)
    with one_line_errors("resubmit"):
        bodies = _bodies(args.bodies) if args.bodies else []
        with app_consumer(args) as found:
            lines = check_ids(found, args.ids) if args.ids else check_bodies(found, bodies, args.message_id_field)
    for line in lines:
        print(line)
    counts = {verdict: sum(line.verdict == verdict for line in lines) for verdict in VERDICTS}
    print(json.dumps({k: v for k, v in counts.items() if v}))
    return 0


def _bodies(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as handle:
            return [line.strip() for line in handle if line.strip()]
    except OSError as exc:
        raise ConfigurationError(f"cannot read --bodies {path}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    sys.exit(main())
