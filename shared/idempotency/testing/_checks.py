"""The proof kit's checks (``prove``, testing/proof.py): every decision, twin, invalid message and
settlement read back from the store and the consumer's reports, the audit, and what an invariant
is given (``Accepted``, ``Stored``)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..audit import account
from ..errors import StoreUnavailable
from ..keys import DedupKey
from ..payload import fingerprint
from ..stores import DedupStore
from ..stores._records import Marker, State
from ._terms import Accepted, Invariant, Message, Stored, Verdict
from .broker import PeekLockQueue

if TYPE_CHECKING:
    from .delivery import Model, Report, Seen

DECISIONS = {"processed": "applied", "declined": "declined", "invalid": "refused as invalid"}
SETTLED = frozenset({"processed", "duplicate", "declined", "invalid", "conflict", "stale"})


def check(verdict: Verdict, by_seq: dict[int, Message], model: Model, seen: Seen, store: DedupStore,
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
        violation("the function reported no outcome: does it call its consumer (on_servicebus, "
                  "on_servicebus_batch, on_eventgrid, on_storage_queue, on_http)?")  # fmt: skip
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
    given = {seq: model.message_id(seq, m.message_id) for seq, m in by_seq.items()}  # the ids the consumer saw
    prints = {seq: fingerprint(model.fingerprinted(payload)) for seq, payload in payloads.items()}
    _check_decisions(verdict, by_seq, given, prints, ours, markers, seen.crashed_after_commit,
                     store.dead_letters(consumer.name), violation)  # fmt: skip
    if model.numbered:
        _check_audit(verdict, store, consumer.name, queue, since, violation)
    if invariant is not None and not found:
        for problem in invariant(_accepted(payloads, prints, ours, markers, by_seq), Stored(store)):
            violation(f"invariant: {problem}")


def _check_decisions(verdict: Verdict, by_seq: dict[int, Message], given: dict[int, str | None],
                     prints: dict[int, str], reports: list[Report],
                     markers: dict[str, list[Marker]], crashed_after_commit: set[int], dead: list[Any],
                     violation: Callable[[str], None]) -> None:  # fmt: skip
    """Per key (``prints``: each copy's fingerprint, as its consumer computes it), one final
    marker, whose payload every copy of it was decided as (once reported,
    the same decision each time); each other payload under the key (a twin) refused and recorded.
    Per invalid message, its dead-letter record with its reason."""
    key_of = {report.seq: report.key for report in reports if report.key is not None}
    said: dict[tuple[str, str | None], Counter[str]] = defaultdict(Counter)  # (key, payload): outcomes
    for report in reports:
        if report.key is not None and report.seq in prints:
            said[(report.key, prints[report.seq])][report.outcome] += 1
    under: dict[str, set[str]] = defaultdict(set)  # per key, the payloads sent under it
    keys_of: dict[tuple[str | None, str], set[str]] = defaultdict(set)  # per message sent, its copies' keys
    for seq in sorted(prints):
        if seq not in key_of:
            violation(f"never decided: sequence {seq} ({by_seq[seq].message_id}) was completed without a key "
                      "reported")  # fmt: skip
            continue
        under[key_of[seq]].add(prints[seq])
        keys_of[(by_seq[seq].message_id, prints[seq])].add(key_of[seq])
    for (message_id, _), keys in keys_of.items():  # e.g. keyed by a Storage queue's id: a new one per enqueue
        if len(keys) > 1:
            violation(f"not decided exactly once: message {message_id} was decided under {len(keys)} keys "
                      f"({', '.join(sorted(keys)[:3])})")  # fmt: skip
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
    for message_id, reason, raw in {(given[seq], m.invalid, m.raw) for seq, m in by_seq.items() if m.invalid}:
        if (message_id, reason) not in records:
            violation(f"invalid message without its dead-letter record: {message_id} ({reason}): {raw[:60]!r}")
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


def _accepted(payloads: dict[int, Any], prints: dict[int, str], reports: list[Report], markers: dict[str, list[Marker]],
              by_seq: dict[int, Message]) -> list[Accepted]:  # fmt: skip
    """One per decided key: the payload its marker's fingerprint names."""
    key_of = {report.seq: report.key for report in reports if report.key is not None}
    found: dict[str, Accepted] = {}
    for seq, payload in sorted(payloads.items()):
        key = key_of.get(seq)
        if key is None or key in found or not markers.get(key):
            continue
        marker = markers[key][0]
        if marker.final and prints[seq] == marker.fingerprint:
            decision = "applied" if marker.state is State.COMPLETED else marker.state.value
            found[key] = Accepted(key, by_seq[seq].message_id, payload, decision)
    return list(found.values())
