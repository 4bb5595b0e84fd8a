"""What would resubmitting dead-lettered messages do? Reads the store only.

    python -m shared.idempotency.resubmit --consumer orders --ids o-1 o-2
    python -m shared.idempotency.resubmit --consumer orders --bodies dead-letters.jsonl [--key-field orderId]

With ids it tells completed / in progress / not processed; with bodies (one JSON message
body per line, as exported from the dead-letter queue) it also compares fingerprints, so
it can tell a resubmit that would be a duplicate from one that would be a conflict.
The store comes from the app settings (DEDUP_STORE, ORDERS_TABLE, ...), as in the app.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .consumer import parse_json
from .errors import InvalidMessage
from .fingerprint import fingerprint
from .keys import DedupKey
from .records import State
from .settings import app_store
from .store import DedupStore

VERDICTS = {
    "duplicate": "completed with this payload: a resubmit is acknowledged as a duplicate",
    "conflict": "completed with another payload: a resubmit is refused as a conflict",
    "completed": "completed: a resubmit is acknowledged as a duplicate if its payload is the same",
    "in_progress": "in progress (two-phase): a resubmit waits for or takes over the claim",
    "new": "not processed: a resubmit is processed",
    "invalid": "not a valid message: a resubmit is dead-lettered again",
}


@dataclass(frozen=True)
class Line:
    key: str
    verdict: str

    def __str__(self) -> str:
        return f"{self.key}\t{self.verdict}\t{VERDICTS[self.verdict]}"


def check_ids(store: DedupStore, scope: str, ids: Iterable[str], partition_for: Callable[[str], str]) -> list[Line]:
    lines = []
    for message_id in ids:
        marker = store.get(DedupKey(scope, message_id), partition_for(message_id))
        verdict = "new" if marker is None else "in_progress" if marker.state is State.IN_PROGRESS else "completed"
        lines.append(Line(message_id, verdict))
    return lines


def check_bodies(
    store: DedupStore, scope: str, bodies: Iterable[bytes], key_field: str, partition_for: Callable[[str], str]
) -> list[Line]:
    lines = []
    for body in bodies:
        try:
            payload = parse_json(body)
            key_id = payload.get(key_field) if isinstance(payload, dict) else None
            key = DedupKey(scope, key_id if isinstance(key_id, str) else "")
            fp = fingerprint(payload)
        except InvalidMessage:
            lines.append(Line(body[:60].decode("utf-8", "replace"), "invalid"))
            continue
        marker = store.get(key, partition_for(key.id))
        if marker is None:
            verdict = "new"
        elif marker.state is State.IN_PROGRESS:
            verdict = "in_progress"
        else:
            verdict = "duplicate" if marker.fingerprint == fp else "conflict"
        lines.append(Line(key.id, verdict))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumer", required=True, help="the consumer's name (e.g. ORDERS_CONSUMER_NAME)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", nargs="+", help="message ids (the dedup keys)")
    source.add_argument("--bodies", help="a file of message bodies, one JSON document per line")
    parser.add_argument("--key-field", default="orderId", help="the body field that holds the key (with --bodies)")
    args = parser.parse_args(argv)

    store = app_store(create=False)

    same_partition: Callable[[str], str] = lambda key_id: key_id  # noqa: E731 - the app's default partition rule
    if args.ids:
        lines = check_ids(store, args.consumer, args.ids, same_partition)
    else:
        with open(args.bodies, "rb") as handle:
            bodies = [line.strip() for line in handle if line.strip()]
        lines = check_bodies(store, args.consumer, bodies, args.key_field, same_partition)
    for line in lines:
        print(line)
    counts = {verdict: sum(line.verdict == verdict for line in lines) for verdict in VERDICTS}
    print(json.dumps({k: v for k, v in counts.items() if v}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
