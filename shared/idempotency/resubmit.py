"""What would resubmitting dead-lettered messages do? Reads the store only, and judges
each message by the consumer's own rules (key source, schema, partition), as processing would.

    python -m shared.idempotency.resubmit --consumer orders --ids o-1 o-2
    python -m shared.idempotency.resubmit --consumer orders --bodies dead-letters.jsonl [--message-id-field orderId]

With ids it tells completed / refused / in progress / not processed; with bodies (one JSON
message body per line, as exported from the dead-letter queue) it also validates them and
compares fingerprints, so it can tell a resubmit that would be a duplicate from one that
would be a conflict, or dead-lettered again as invalid (with the reason). The consumer and
its store come from the app (the consumers function_app declares, built from the app settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import registry
from .consumer import Delivery, parse_json
from .errors import InvalidMessage
from .keys import DedupKey
from .records import Marker, State

if TYPE_CHECKING:
    from .consumer import IdempotentConsumer

VERDICTS = {
    "duplicate": "completed with this payload: a resubmit is acknowledged as a duplicate",
    "conflict": "completed with another payload: a resubmit is refused as a conflict",
    "completed": "completed: a resubmit is acknowledged as a duplicate if its payload is the same",
    "in_progress": "in progress (two-phase): a resubmit waits for or takes over the claim",
    "refused": "a step was refused for good downstream: a resubmit is dead-lettered again",
    "new": "not processed: a resubmit is processed",
    "invalid": "not a valid message: a resubmit is dead-lettered again",
}


@dataclass(frozen=True)
class Line:
    key: str
    verdict: str
    reason: str = ""

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.key}\t{self.verdict}\t{VERDICTS[self.verdict]}{why}"


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
        lines.append(Line(message_id, _state(consumer, key, consumer.partition_of(key))[0]))
    return lines


def check_bodies(consumer: IdempotentConsumer, bodies: Iterable[bytes], message_id_field: str | None) -> list[Line]:
    """``message_id_field``: the body field holding the message's MessageId, when the DLQ
    export has bodies only (for a consumer keyed by MessageId)."""
    lines = []
    for body in bodies:
        try:
            message_id = _field(body, message_id_field)
            key, partition, fp = consumer.identify(Delivery(body=body, message_id=message_id))
        except InvalidMessage as exc:
            lines.append(Line(body[:60].decode("utf-8", "replace"), "invalid", f"{exc.reason}: {exc.detail[:200]}"))
            continue
        verdict, marker = _state(consumer, key, partition)
        if marker is not None and verdict == "completed":
            verdict = "duplicate" if marker.fingerprint == fp else "conflict"
        lines.append(Line(key.id, verdict))
    return lines


def _field(body: bytes, name: str | None) -> str | None:
    if name is None:
        return None
    payload = parse_json(body)
    value = payload.get(name) if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumer", required=True, help="the consumer's name (its marker scope)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", nargs="+", help="message ids (the dedup keys)")
    source.add_argument("--bodies", help="a file of message bodies, one JSON document per line")
    parser.add_argument("--message-id-field", help="with --bodies: the body field that holds the MessageId")
    args = parser.parse_args(argv)

    import function_app  # noqa: F401 - declares the app's consumers, built from its settings

    found = [c for c in registry.declared() if c.name == args.consumer]
    if not found:
        parser.error(f"no consumer named {args.consumer!r} in function_app")
    if args.ids:
        lines = check_ids(found[0], args.ids)
    else:
        with open(args.bodies, "rb") as handle:
            bodies = [line.strip() for line in handle if line.strip()]
        lines = check_bodies(found[0], bodies, args.message_id_field)
    for line in lines:
        print(line)
    counts = {verdict: sum(line.verdict == verdict for line in lines) for verdict in VERDICTS}
    print(json.dumps({k: v for k, v in counts.items() if v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
