"""``python -m shared.idempotency.audit``: the audit of one consumer's window, from the command
line (the package's docstring says what it reads and prints; the exit code: 0 when everything
is accounted for, 1 when some are unaccounted, 2 when it cannot run)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

import isodate

from . import SETTLE, ServiceBusPeek, run
from . import __doc__ as described


def main(argv: list[str] | None = None) -> int:
    from ..commands import app_consumer, command, consumer_options, one_line_errors
    from ..functions._senders import servicebus_client

    parser = command("shared.idempotency.audit", described)
    consumer_options(parser)
    parser.add_argument("--queue", help="the queue it reads")
    parser.add_argument("--topic", help="the topic it reads, with --subscription")
    parser.add_argument("--subscription", help="its subscription")
    parser.add_argument("--settle", default=SETTLE, type=_duration, help="how long ago the window ends (ISO 8601)")
    parser.add_argument("--save", action="store_true", help="record what it finds, and the window's end: the next "
                        "audit starts there (without it, it reads only)")  # fmt: skip
    args = parser.parse_args(argv)
    with one_line_errors("audit"), app_consumer(args) as consumer, servicebus_client("the audit peeks") as client:
        broker = ServiceBusPeek(client, args.queue, args.topic, args.subscription)
        found = run(consumer.store, consumer.name, broker, settle=args.settle, keep=args.save,
                    kept_for=consumer.retention)  # fmt: skip
    for gap in found.unaccounted:
        print(f"{gap.sequence}\tunaccounted\t{gap.between()}")
    for note in found.skipped:
        print(f"not judged\t{note}")
    print(json.dumps(found.summary()))
    return 1 if found.unaccounted else 0


def _duration(text: str) -> timedelta:
    try:
        return isodate.parse_duration(text)  # type: ignore[no-any-return]
    except (isodate.ISO8601Error, ValueError):
        raise argparse.ArgumentTypeError(f"not an ISO 8601 duration: {text!r}") from None


if __name__ == "__main__":
    sys.exit(main())
