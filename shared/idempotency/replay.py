"""Replay parked messages: those a source will not deliver again (an Event Hubs checkpoint
moved past them while they still failed), kept as dead-letter records with reason
``parked``. Each goes through its consumer again, as a new delivery: what was applied in
the meantime is a duplicate, the rest is processed.

    python -m shared.idempotency.replay --consumer shipments [--consumers consumers]

One line per record (message id, outcome, reason), then a JSON summary; exit 1 when some
still fail (run it again later) or cannot be replayed from their record (``truncated``: it
kept only the head of the body; replay those from their source), 2 when it cannot run
(settings, store, unknown consumer).
Records stay until DEDUP_DEAD_LETTER_RETENTION: a second replay is only duplicates.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from .commands import app_consumer, command, consumer_options, one_line_errors, printable
from .messages import Delivery
from .reasons import Reason

TRUNCATED = "truncated"  # a record keeping only the head of a body too large for it: never replayed


def main(argv: list[str] | None = None) -> int:
    parser = command("shared.idempotency.replay", __doc__)
    consumer_options(parser)
    args = parser.parse_args(argv)
    with one_line_errors("replay"), app_consumer(args) as consumer:
        parked = [r for r in consumer.store.dead_letters(consumer.name) if r.reason == Reason.PARKED]
        outcomes: Counter[str] = Counter()
        for record in parked:
            if record.truncated:  # only its head is kept: processing it would refuse or change it
                outcomes[TRUNCATED] += 1
                why = f"{len(record.body)} of its {record.body_size} bytes kept (SHA-256 {record.body_sha256})"
                print(f"{printable(record.message_id or '')}\t{TRUNCATED}\t{why}: replay it from its source")
                continue
            result = consumer.process(Delivery(record.body, message_id=record.message_id,
                                               correlation_id=record.correlation_id,
                                               first_enqueued_at=record.enqueued_at))  # fmt: skip
            outcomes[result.outcome.value] += 1
            print(f"{printable(record.message_id or '')}\t{result.outcome.value}\t{printable(result.reason or '')}")
    print(json.dumps({"parked": len(parked), **outcomes}))
    return 1 if outcomes["transient"] or outcomes["in_flight"] or outcomes[TRUNCATED] else 0


if __name__ == "__main__":
    sys.exit(main())
