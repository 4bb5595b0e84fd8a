"""Files imported record by record, each record applied once in effect: ETL that reprocesses
replayed data. A file is JSON Lines (one object per line, the record's own key in
``key_field``); the same file may arrive again (a duplicate event, a re-upload), corrected,
or be cut off mid-way by a crash.

- **Read whole first.** A file larger than ``max_bytes``, or with a line that is not a JSON
  object, lacks its key or repeats another line's key, is refused: a dead-letter record
  with the reason (and the line), nothing applied — an upload cut short never half-applies.
- **Each record is a message** keyed by (file, record key, revision). A file's records share
  one store partition, so their commits go in transactions of up to 100 operations.
- **What was applied is read back, not redone.** Beside each applied record the import writes
  a row with its fingerprint (SHA-256 of its canonical JSON) and revision. An import reads
  those rows first (a thousand per request) and skips, without a request, every record whose
  fingerprint is the one last applied for its key: what a crashed run committed, what a
  corrected file left unchanged. A changed record is applied as its key's next revision; a
  record the new file no longer holds is left as it was.
- **The same content is recognised whole.** Once every record is acknowledged, the file's row
  keeps the content's SHA-256: the same content again costs that one read.
- Two runs of different contents of one file at once: the loser of a revision meets a
  conflict and its run fails, to be delivered again, when the file is read again — the
  latest content is what ends applied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import dead_letters
from .config import DedupConfig, whole
from .consumer import Handler, IdempotentConsumer
from .errors import InvalidMessage
from .keys import DedupKey, consumer_partition, joined_identity
from .messages import Delivery, Effects, Entity, Outcome, Result, utcnow
from .payload import fingerprint, parse_json
from .reasons import Reason
from .steps import Context
from .stores._base import DedupStore

MAX_BYTES = "67108864"  # DEDUP_IMPORT_MAX_BYTES's default, 64 MiB: a file is held in memory whole
CHUNK = 500  # records decided and committed together
_APPLIED = "~import|"  # the rows of what was applied: "~import|<key hash>|<revision>"
_FILE = "~file"  # the file's row: the SHA-256 of the content last imported whole
_UNREAD = frozenset({Outcome.CONFLICT})  # a revision another run took: the file must be read again


@dataclass(frozen=True)
class Record:
    line: int
    key: str
    body: bytes
    fingerprint: str


@dataclass(frozen=True)
class ImportRun:
    """One run over a file: what it applied, skipped and refused."""

    file: str
    sha256: str
    records: int = 0
    unchanged: int = 0  # skipped: applied before with the same content
    recognised: bool = False  # the same content was imported whole before: one read
    refused: Result | None = None  # the file itself, refused
    deliveries: Sequence[Delivery] = ()
    results: Sequence[Result] = ()

    @property
    def done(self) -> bool:
        """Every record acknowledged (applied now or before, or refused with a record), and no
        revision lost to another run: the file needs no other delivery."""
        return all(r.acknowledge and r.outcome not in _UNREAD for r in self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(result.outcome is outcome for result in self.results)


class FileImport(IdempotentConsumer):
    """A consumer of files: ``run(file, content)`` applies each record once with ``handler``
    (the record, its ``Context``) → ``Effects`` (a ``LatestState`` is refused). Its entities are stored under names made
    unique per record and revision (``<key hash>|<revision>|<name>``). ``max_bytes``: by
    default DEDUP_IMPORT_MAX_BYTES."""

    def __init__(self, name: str, store: DedupStore, handler: Handler, *, key_field: str,
                 schema: Mapping[str, Any] | None = None, config: DedupConfig | None = None,
                 max_bytes: int | None = None) -> None:  # fmt: skip
        # Refusals are recorded here: a conflict is not one (the file is read again).
        super().__init__(name, store, self._apply, schema=schema, config=config, partition_for=_file_of,
                         record_refusals=False)  # fmt: skip
        self._record_handler = handler
        self.key_field = key_field
        self.max_bytes = max_bytes_setting() if max_bytes is None else max_bytes

    def run(self, file: str, content: bytes, *, delivery_count: int | None = None,
            max_deliveries: int | None = None) -> ImportRun:  # fmt: skip
        """Import ``content``, the whole of ``file`` (``<container>/<blob>``). StoreUnavailable
        when what was applied cannot be read: the run fails and is delivered again."""
        sha = hashlib.sha256(content).hexdigest()
        partition = consumer_partition(self.name, file)
        whole = Delivery(content, message_id=file, delivery_count=delivery_count, max_deliveries=max_deliveries)
        last = self.store.read_entities(partition, _FILE, 1)
        if last and last[0].data.get("sha256") == sha:
            return ImportRun(file, sha, recognised=True)
        try:
            records = self.records(content)
        except InvalidMessage as exc:
            refusal = Result(Outcome.INVALID, DedupKey(self.name, file), exc.reason, exc.detail)
            refusal = dead_letters.record(self.store, self.name, whole, refusal)
            if refusal.acknowledge:
                self.store.put_entity(partition, Entity(_FILE, {"sha256": sha, "refused": refusal.reason}))
            return ImportRun(file, sha, refused=refusal, results=[refusal])
        applied = self.applied(partition)
        deliveries, unchanged = [], 0
        for record in records:
            revision, fp = applied.get(record.key, (0, ""))
            if fp == record.fingerprint:
                unchanged += 1
                continue
            deliveries.append(Delivery(record.body, message_id=joined_identity(file, record.key, str(revision + 1)),
                                       delivery_count=delivery_count, max_deliveries=max_deliveries,
                                       properties={"file": file, "line": record.line}))  # fmt: skip
        results: list[Result] = []
        for start in range(0, len(deliveries), CHUNK):
            results += self.process_batch(deliveries[start : start + CHUNK])
        results = [dead_letters.record(self.store, self.name, d, r) if r.outcome is Outcome.INVALID else r
                   for d, r in zip(deliveries, results, strict=True)]  # fmt: skip
        run = ImportRun(file, sha, len(records), unchanged, deliveries=deliveries, results=results)
        if run.done:
            self.store.put_entity(partition, Entity(_FILE, {"sha256": sha, "records": len(records),
                                                           "importedAt": utcnow().isoformat()}))  # fmt: skip
        return run

    def records(self, content: bytes) -> list[Record]:
        """The file's records, or InvalidMessage for the whole file (too large, malformed)."""
        if len(content) > self.max_bytes:
            raise InvalidMessage(Reason.FILE_TOO_LARGE, f"{len(content)} bytes; at most {self.max_bytes} are imported")
        records: list[Record] = []
        lines: dict[str, int] = {}
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = parse_json(line)
                fp = fingerprint(value)
            except InvalidMessage as exc:
                raise InvalidMessage(Reason.FILE_MALFORMED, f"line {number}: {exc.reason}: {exc.detail}"[:500]) from exc
            key = value.get(self.key_field) if isinstance(value, dict) else None
            if isinstance(key, bool) or not isinstance(key, str | int) or key == "":
                raise InvalidMessage(Reason.FILE_MALFORMED, f"line {number}: not a JSON object with its key "
                                     f"{self.key_field!r} (a string or an integer)")  # fmt: skip
            if str(key) in lines:
                raise InvalidMessage(Reason.FILE_MALFORMED, f"line {number}: key {str(key)[:200]!r} is on line "
                                     f"{lines[str(key)]} too")  # fmt: skip
            lines[str(key)] = number
            records.append(Record(number, str(key), line, fp))
        return records

    def applied(self, partition: str) -> dict[str, tuple[int, str]]:
        """Per record key, the revision last applied and its fingerprint."""
        latest: dict[str, tuple[int, str]] = {}
        for row in self.store.read_entities(partition, _APPLIED, 2**62):
            key, revision = str(row.data["recordKey"]), int(row.data["revision"])
            if revision > latest.get(key, (0, ""))[0]:
                latest[key] = (revision, str(row.data["fingerprint"]))
        return latest

    def _apply(self, record: Any, context: Context) -> Effects:
        """The handler's effects, and the row that says this revision of the record is applied."""
        _, key, revision = parse_json(context.key.id.encode())
        effects = self._record_handler(record, context)
        if not isinstance(effects, Effects):
            what = type(effects).__name__
            raise InvalidMessage(Reason.HANDLER_RESULT, f"an import's handler returns Effects, not {what}")
        hashed = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        row = Entity(f"{_APPLIED}{hashed}|{int(revision):09d}",
                     {"recordKey": key, "revision": int(revision), "fingerprint": context.fingerprint})  # fmt: skip
        named = [Entity(f"{hashed}|{revision}|{entity.name}", entity.data) for entity in effects.entities]
        return replace(effects, entities=[row, *named])


def max_bytes_setting() -> int:
    """DEDUP_IMPORT_MAX_BYTES: the largest file an import reads (default 64 MiB)."""
    return whole("DEDUP_IMPORT_MAX_BYTES", MAX_BYTES)


def _file_of(key: DedupKey) -> str:
    """A record's partition: its file's (the key is [file, record key, revision])."""
    return str(parse_json(key.id.encode())[0])
