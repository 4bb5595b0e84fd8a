"""What would resubmitting dead-lettered messages do? Reads the store only, and judges
each message by the consumer's own rules (key source, schema, partition), as processing would.

    python -m shared.idempotency.resubmit --consumer orders --ids o-1 o-2
    python -m shared.idempotency.resubmit --consumer orders --bodies dead-letters.jsonl [--message-id-field orderId]

With ids it tells completed / refused / in progress / not processed; with bodies (one JSON
message body per line, as exported from the dead-letter queue) it also validates them and
compares fingerprints, so it can tell a resubmit that would be a duplicate from one that
would be a conflict, or dead-lettered again as invalid (with the reason). The consumer comes from
the module that declares the app's consumers (``--consumers``, default ``consumers``: never
the function app itself), its store from the app settings.

It prints one line per id or body, then a JSON summary; what it cannot do (a setting, the
file, the store, an unknown consumer) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from azure.core.exceptions import AzureError, ResourceNotFoundError

from .config import setting
from .errors import ConfigurationError, DedupError, InvalidMessage
from .functions import declared_consumer, using_store
from .keys import DedupKey, consumer_partition
from .messages import Delivery
from .payload import parse_json
from .stores import app_store
from .stores._records import Marker, State

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


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` safe for a terminal and a tab-separated line. Keys, bodies and reasons come
    from senders: an escape sequence could drive the terminal, a newline forge a verdict.
    What ``str.isprintable`` refuses (C0, DEL, C1, U+2028/U+2029, bidi and other format
    controls, lone surrogates) is escaped as in a Python literal, and so is the backslash,
    so that no two texts print alike."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else _ESCAPES.get(c) or _escape(ord(c)) for c in text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


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
        lines.append(Line(message_id, _state(consumer, key, consumer.partition_of(key))[0]))
    return lines


def check_bodies(consumer: IdempotentConsumer, bodies: Iterable[bytes], message_id_field: str | None) -> list[Line]:
    """``message_id_field``: the body field holding the message's MessageId, when the DLQ
    export has bodies only (for a consumer keyed by MessageId)."""
    lines = []
    for body in bodies:
        try:
            key, partition, fp = consumer.identify(Delivery(body=body, message_id=_field(body, message_id_field)))
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
    parser.add_argument("--consumers", default="consumers",
                        help="the module that declares the app's consumers (default: consumers)")  # fmt: skip
    args = parser.parse_args(argv)

    bodies: list[bytes] = []
    if args.bodies:
        try:
            with open(args.bodies, "rb") as handle:
                bodies = [line.strip() for line in handle if line.strip()]
        except OSError as exc:
            return _error(f"cannot read --bodies {args.bodies}: {exc.strerror or exc}")
    try:
        # Never create tables: a typo in DEDUP_TABLE must fail here, not report every message new.
        with using_store(app_store(create=False)):
            found = declared_consumer(args.consumer, args.consumers)
            # One read of an empty partition: a missing table or container fails here, before any verdict.
            next(found.store.scan(consumer_partition(found.name, "")), None)
            lines = check_ids(found, args.ids) if args.ids else check_bodies(found, bodies, args.message_id_field)
    except ConfigurationError as exc:
        return _error(str(exc))
    except ImportError as exc:
        return _error(f"cannot import --consumers {args.consumers}: {exc}")
    except ResourceNotFoundError:
        return _error(f"{_table()} does not exist: check the app settings (this tool never creates it)")
    except (DedupError, AzureError) as exc:  # unreachable, access refused (store_errors maps them)
        return _error(f"cannot read the store: {_first_line(exc)}")
    for line in lines:
        print(line)
    counts = {verdict: sum(line.verdict == verdict for line in lines) for verdict in VERDICTS}
    print(json.dumps({k: v for k, v in counts.items() if v}))
    return 0


def _table() -> str:
    """What the markers are read from, as app_store names it."""
    table = setting("DEDUP_TABLE", "records")
    if setting("DEDUP_STORE", "table").lower() != "cosmos":
        return f"table '{table}'"
    database = setting("COSMOS_DATABASE", "dedup")
    return f"container '{setting('COSMOS_CONTAINER', table)}' of database '{database}'"


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _error(message: str) -> int:
    print(f"resubmit: error: {printable(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    logging.getLogger("idempotency").addHandler(logging.NullHandler())  # main says what failed, in one line
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character gets its escape
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    sys.exit(main())
