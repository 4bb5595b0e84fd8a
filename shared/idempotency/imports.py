"""Files imported record by record, each record applied once in effect: ETL that reprocesses
replayed data. A file is JSON Lines (one object per line, the record's own key in
``key_field``) with a ``version`` that orders its uploads (a blob's Last-Modified); the same
file may arrive again (a duplicate event, a re-upload), corrected, or be cut off mid-way.

- **Read whole first.** A file larger than ``max_bytes``, or with a line that is not a JSON
  object, lacks its key or repeats another line's key, is refused: a dead-letter record with
  the reason (and the line), nothing applied — an upload cut short never half-applies.
- **Each record is a message** keyed by (file, record key, version). A file's records share
  one store partition, so their commits go in transactions of up to 100 operations.
- **What was applied is read back, not redone.** Beside each applied record the import writes
  a row with its fingerprint (SHA-256 of its canonical JSON) and version. A run reads those
  rows first (a thousand per request) and skips, without a request, every record whose
  fingerprint is the one last applied for its key — what a crashed run committed, what a
  corrected file left unchanged — and every record a newer version applied already (an older
  upload's late run). A changed record is applied at the file's version; the row it
  supersedes is deleted after the run, so that a file keeps one row per key.
- **The same content is recognised whole.** Once a run leaves nothing to do (every record
  applied, or the file refused for its content), the file's row keeps the content's SHA-256,
  written only over an older version: the same content again costs that one read. A run that
  changes records first marks the row in progress, so that content imported whole before is
  not recognised over a newer upload's half-applied records.
- Two uploads within one version (a blob's Last-Modified has whole seconds) with other
  content: the later one's changed records meet the earlier's markers with other data, a
  conflict, dead-lettered and alerted as every conflict.
- A run stops at its ``deadline`` and after a chunk whose records still fail after their wait:
  it is not done, and the next run resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from . import dead_letters
from .config import DedupConfig, whole
from .consumer import Handler, IdempotentConsumer
from .errors import DedupError, InvalidMessage
from .keys import DedupKey, consumer_partition, joined_identity
from .messages import Delivery, Effects, Entity, Outcome, Result, utcnow
from .payload import fingerprint, parse_json
from .reasons import Reason
from .steps import Context
from .stores._base import DedupStore

log = logging.getLogger("idempotency")

MAX_BYTES = "4194304"  # DEDUP_IMPORT_MAX_BYTES's default, 4 MiB: a file is read whole, and imported in a run
CHUNK = 500  # records decided and committed together
_APPLIED = "~import|"  # the rows of what was applied: "~import|<key hash>|<version>"
_FILE = "~file"  # the file's row: the SHA-256 and version of the content last imported whole
_BOM = b"\xef\xbb\xbf"


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
    version: int
    records: int = 0
    unchanged: int = 0  # skipped: applied before with the same content
    stale: int = 0  # skipped: a newer version of the file applied them
    recognised: bool = False  # the same content was imported whole before: one read
    newer: bool = False  # a newer version of the file was imported whole: nothing to do, one read
    refused: Result | None = None  # the file itself, refused
    results: tuple[Result, ...] = ()
    pending: int = 0  # records not tried: the run stopped (its deadline, or a chunk still failing)

    @property
    def done(self) -> bool:
        """Every record acknowledged (applied now or before, or refused with a record): the
        file needs no other run."""
        return not self.pending and all(result.acknowledge for result in self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(result.outcome is outcome for result in self.results)


class FileImport(IdempotentConsumer):
    """A consumer of files: ``run(file, content, version)`` applies each record once with
    ``handler`` (the record, its ``Context``) → ``Effects``, without outgoing messages. Its
    entities are kept per record and version (``<key hash>|<version>|<name>``, the file's
    history): ``current`` reads each record's latest. ``max_bytes``: by default
    DEDUP_IMPORT_MAX_BYTES."""

    def __init__(self, name: str, store: DedupStore, handler: Handler, *, key_field: str,
                 schema: dict[str, Any] | None = None, config: DedupConfig | None = None,
                 max_bytes: int | None = None) -> None:  # fmt: skip
        super().__init__(name, store, self._apply, schema=schema, config=config, partition_for=_file_of)
        self._record_handler = handler
        self.key_field = key_field
        self.max_bytes = max_bytes_setting() if max_bytes is None else max_bytes

    def run(self, file: str, content: bytes, version: int, *, deadline: float | None = None) -> ImportRun:
        """Import ``content``, the whole of ``file`` (``<container>/<blob>``) at ``version``;
        ``deadline``: a ``time.monotonic()`` after which no chunk starts. StoreUnavailable when
        what was applied cannot be read: the run fails and is delivered again."""
        sha, partition = hashlib.sha256(content).hexdigest(), consumer_partition(self.name, file)
        last = next(iter(self.store.read_entities(partition, _FILE, 1)), None)
        if (
            last is not None
            and last.data.get("sha256") == sha
            and last.data.get("maxBytes") in (None, str(self.max_bytes))
        ):
            return ImportRun(file, sha, version, recognised=True)
        if last is not None and int(last.data["version"]) > version:  # a newer upload was imported whole
            return ImportRun(file, sha, version, newer=True)
        try:
            records = self.records(content)
        except InvalidMessage as exc:
            return self._refuse(file, sha, version, content, exc)
        applied = self.applied(partition)
        deliveries, superseded, unchanged, stale = [], [], 0, 0
        for record in records:
            latest, fp = applied.get(record.key, (-1, ""))
            if latest > version:
                stale += 1
            elif fp == record.fingerprint:
                unchanged += 1
            else:
                deliveries.append(Delivery(record.body, message_id=joined_identity(file, record.key, str(version)),
                                           properties={"file": file, "line": record.line}))  # fmt: skip
                superseded.append(_row(record.key, latest) if 0 <= latest < version else None)
        if deliveries:  # until it is done, the file's row recognises no content: this one may be half applied
            self._imported(partition, {"sha256": "", "records": len(records)}, version, complete=False)
        results: list[Result] = []
        for start in range(0, len(deliveries), CHUNK):
            if deadline is not None and time.monotonic() >= deadline:
                break
            results += self.process_batch(deliveries[start : start + CHUNK])
            if not all(result.acknowledge for result in results[start:]):  # waited already: the next run
                break
        run = ImportRun(file, sha, version, len(records), unchanged, stale, results=tuple(results),
                        pending=len(deliveries) - len(results))  # fmt: skip
        if run.done:
            done = [
                name for name, r in zip(superseded, results, strict=True) if name and r.outcome is Outcome.PROCESSED
            ]
            self._tidy(partition, done)
            if not run.count(Outcome.INVALID) + run.count(Outcome.CONFLICT):  # a refused record may be fixed
                self._imported(partition, {"sha256": sha, "records": len(records)}, version, complete=True)
        return run

    def records(self, content: bytes) -> list[Record]:
        """The file's records, or InvalidMessage for the whole file (too large, malformed)."""
        if len(content) > self.max_bytes:
            raise InvalidMessage(Reason.FILE_TOO_LARGE, f"{len(content)} bytes; at most {self.max_bytes} are imported")
        records: list[Record] = []
        lines: dict[str, int] = {}
        for number, line in enumerate(content.removeprefix(_BOM).splitlines(), start=1):
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
            if str(key) in lines:  # 1 and "1" are one key
                raise InvalidMessage(Reason.FILE_MALFORMED, f"line {number}: key {str(key)[:200]!r} is on line "
                                     f"{lines[str(key)]} too")  # fmt: skip
            lines[str(key)] = number
            records.append(Record(number, str(key), line, fp))
        return records

    def applied(self, partition: str) -> dict[str, tuple[int, str]]:
        """Per record key, the version last applied and its fingerprint."""
        latest: dict[str, tuple[int, str]] = {}
        for row in self.store.read_entities(partition, _APPLIED, 2**62):
            key, version = str(row.data["recordKey"]), int(str(row.data["version"]))
            if version > latest.get(key, (-1, ""))[0]:
                latest[key] = (version, str(row.data["fingerprint"]))
        return latest

    def current(self, file: str, name: str) -> dict[str, dict[str, Any]]:
        """Per record key, the handler's entity ``name`` as the latest applied version has it
        (one range read of the file's partition): for operators and tests, not for each run."""
        partition = consumer_partition(self.name, file)
        latest = self.applied(partition)
        stored = {e.name: e.data for e in self.store.read_entities(partition, "", 2**62)}
        wanted = {key: f"{_hashed(key)}|{version:012d}|{name}" for key, (version, _) in latest.items()}
        return {key: stored[entity] for key, entity in wanted.items() if entity in stored}

    def _apply(self, record: Any, context: Context) -> Effects:
        """The handler's effects, and the row that says this version of the record is applied."""
        _, key, version = json.loads(context.key.id)
        effects = self._record_handler(record, context)
        if not isinstance(effects, Effects) or effects.messages:
            what = "outgoing messages" if isinstance(effects, Effects) else type(effects).__name__
            raise InvalidMessage(Reason.HANDLER_RESULT, f"an import's handler returns Effects without messages, "
                                 f"not {what}")  # fmt: skip
        # Versions as text: a Table store reads a number past Int32 back typed.
        row = Entity(_row(key, int(version)), {"recordKey": key, "version": version,
                                               "fingerprint": context.fingerprint})  # fmt: skip
        named = [Entity(f"{_hashed(key)}|{int(version):012d}|{e.name}", e.data) for e in effects.entities]
        return replace(effects, entities=[row, *named])

    def _refuse(self, file: str, sha: str, version: int, content: bytes, exc: InvalidMessage) -> ImportRun:
        """The whole file refused: a dead-letter record with why. Its row recognises the same
        content again (too large: under the same limit only)."""
        refusal = Result(Outcome.INVALID, DedupKey(self.name, file), exc.reason, exc.detail)
        refusal = dead_letters.record(self.store, self.name, Delivery(content, message_id=file), refusal)
        if refusal.acknowledge:
            limit = {"maxBytes": str(self.max_bytes)} if exc.reason == Reason.FILE_TOO_LARGE else {}
            self._imported(consumer_partition(self.name, file), {"sha256": sha, "refused": exc.reason, **limit},
                           version, complete=True)  # fmt: skip
        return ImportRun(file, sha, version, refused=refusal, results=(refusal,))

    def _imported(self, partition: str, data: dict[str, Any], version: int, *, complete: bool) -> None:
        """The file's row, over an older version's only (of two runs, the newer upload's stays);
        of one version, a run done over one in progress."""
        row = Entity(_FILE, {**data, "version": str(version), "importedAt": utcnow().isoformat()})
        self.store.upsert_if_newer(partition, row, 2 * version + complete)

    def _tidy(self, partition: str, superseded: list[str]) -> None:
        """Delete the rows the run's records superseded: a file keeps one row per key. Left
        behind (the store failing now), they cost reads, never a wrong skip: the latest wins."""
        try:
            self.store.delete_entities(partition, superseded)
        except DedupError as exc:
            log.warning("dedup import %s: %d superseded rows left in %s: %s", self.name, len(superseded), partition,
                        exc)  # fmt: skip


def max_bytes_setting() -> int:
    """DEDUP_IMPORT_MAX_BYTES: the largest file an import reads (default 4 MiB)."""
    return whole("DEDUP_IMPORT_MAX_BYTES", MAX_BYTES)


def _row(key: str, version: int) -> str:
    return f"{_APPLIED}{_hashed(key)}|{version:012d}"


def _hashed(key: str) -> str:
    """A record key in fixed width, for entity names: any key, however long or odd."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _file_of(key: DedupKey) -> str:
    """A record's partition: its file's (the key is [file, record key, version], ours)."""
    return str(json.loads(key.id)[0])
