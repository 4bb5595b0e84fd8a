"""A consumer's dead-letter records, for an operator: listed, and their bodies exported in the
file ``resubmit --bodies`` reads. Reads the store only.

    python -m shared.idempotency.dead_letter_records --consumer orders [--reason R] [--export FILE]

One line per record (when, reason, MessageId, key, detail), then a JSON summary (by reason, and
with ``--export`` how many bodies were written and left out: one kept only as its head, or not
JSON, would be refused again). Exit 2 when it cannot run (settings, a table, the store, the
consumer, the file).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from .commands import app_consumer, command, consumer_options, one_line_errors, printable
from .errors import ConfigurationError, InvalidMessage
from .payload import parse_json
from .stores._records import DeadLetter


def exported(record: DeadLetter) -> bytes | None:
    """A record's body as one line of ``resubmit --bodies``'s file (compact JSON); None when it
    cannot be one: only the head of it was kept (``truncated``), or it is not JSON (it would only
    be refused again)."""
    if record.truncated:
        return None
    try:
        return json.dumps(parse_json(record.body), ensure_ascii=False, separators=(",", ":")).encode()
    except InvalidMessage:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = command("shared.idempotency.dead_letter_records", __doc__)
    consumer_options(parser)
    parser.add_argument("--reason", help="only the records of this reason (e.g. parked, schema_violation)")
    parser.add_argument("--export", type=Path, metavar="FILE", help="write their bodies here, one per line")
    args = parser.parse_args(argv)
    with one_line_errors("dead_letter_records"), app_consumer(args) as consumer:
        records = [r for r in consumer.store.dead_letters(consumer.name) if args.reason in (None, r.reason)]
        records.sort(key=lambda r: (r.recorded_at is None, r.recorded_at))
        lines = [exported(r) for r in records]
        if args.export is not None:
            try:
                args.export.write_bytes(b"".join(line + b"\n" for line in lines if line is not None))
            except OSError as exc:
                raise ConfigurationError(f"cannot write --export {args.export}: {exc.strerror or exc}") from None
    for record in records:
        when = record.recorded_at.isoformat(timespec="seconds") if record.recorded_at else ""
        fields = (when, record.reason, record.message_id or "", record.key_id or "", record.detail[:200])
        print("\t".join(printable(str(field)) for field in fields))
    left_out = sum(line is None for line in lines)
    summary = {"records": len(records), **Counter(r.reason for r in records)}
    if args.export is not None:
        summary |= {"exported": len(records) - left_out, "left_out": left_out}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
