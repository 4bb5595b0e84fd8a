"""Table Storage has no TTL. So that a purge reads what fell due rather than the whole table
(markers live beside the business data, in every partition), the store notes every final
marker it writes in an *expiry index*, and the purge follows the index.

- **Notes**: (partition, marker RowKey, the marker's ETag, guard RowKey or "") under the hour
  the marker expires. Written in batches: one index row holds up to 250 notes of one hour;
  a full row is taken under the lock and written by one background thread, the rest
  ``FLUSH_AFTER`` after the first note (a timer thread), before a purge and at exit — 0.004
  request per marker.
- **Rows** live in the store's own table, beside the markers, in partition
  ``~expiry|<table>|YYYYMMDDHH`` (the library's other bookkeeping there, the outbox's and
  the jobs', is stored under *encoded* keys, and an encoded key never holds a raw ``|``: no
  business partition can be an index partition): the hour the notes expire, or the hour they
  are written if that is later (never behind the cursor). Each row says when its last note
  expires (``Until``). ``TableStore.scan`` and the full sweep pass them over (no ``Kind``).
- **The purge** reads the hours from a cursor (the first hour not yet emptied) to now, a row
  at a time (the deadline is checked before each), hands the notes of every row that fell
  due to the store to delete in parallel, deletes the row, and moves the cursor past each
  emptied hour once no flush can still file a note there. Its budget is exact: the row it
  runs out in is purged in part and rewritten with the notes left. Its cost follows the
  expired markers, not the table.
- What the index does not hold (notes of an instance that died before writing them, claims
  never final, deletes the service refused): the rare full sweep, ``sweep_expired``.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from ..errors import DedupError
from ..messages import utcnow
from ._azure import store_errors
from ._records import Purge
from ._table_sdk import SdkTransactions, Transactions

log = logging.getLogger("idempotency")
REPLACE = {"mode": UpdateMode.REPLACE}  # the whole row: an upsert's, a rewrite's

INDEX = "~expiry|"  # partition of an hour's index rows: ~expiry|<table>|YYYYMMDDHH
PAGE = 8  # index rows per read: 2,000 notes, a few seconds of deletes between deadline checks
NOTES_PER_ROW = 250  # ~50 KB of notes with short keys; longer ones split the row (_fitting)
FLUSH_AFTER = 60.0  # seconds a note may wait in memory: what a crash can leave to the full sweep
MAX_PENDING = 20_000  # notes held while the index cannot be written; beyond, the full sweep finds them
CONCURRENCY = 16  # deletes in flight during a purge
FIRST_PURGE = timedelta(days=2)  # how far back a purge without a cursor starts
SETTLE = timedelta(minutes=5)  # after an hour ends, how long a flush begun in it may take to land
_HOUR = "%Y%m%d%H"
_EPOCH, _ONE_HOUR = datetime(1970, 1, 1, tzinfo=UTC), timedelta(hours=1)
_ROW_BYTES = 60_000  # an Edm.Binary property holds 64 KiB


class Note(NamedTuple):
    partition: str  # as stored (encoded)
    marker: str  # RowKey
    etag: str  # the marker is deleted only at this version ("": at any)
    guard: str  # RowKey of its guard, "" for none


class ExpiryIndex:
    """The notes of one store's markers (``scope``: its table's name) in ``table``, the
    store's own, and the purge over them."""

    def __init__(self, table: TableClient, scope: str, *, concurrency: int = CONCURRENCY,
                 writes: Transactions | None = None) -> None:  # fmt: skip
        """``writes``: the store's transport, through which every row is written (``table``'s
        own SDK client by default); ``table`` is read."""
        self._table = table
        self._writes: Transactions = writes or SdkTransactions(table)
        self._prefix = f"{INDEX}{scope}|"
        self._cursor = {"PartitionKey": self._prefix + "cursor", "RowKey": "cursor"}
        self._concurrency = concurrency
        self._pending: dict[str, list[tuple[Note, datetime]]] = {}  # by the hour the markers expire
        self._mutex = threading.Lock()
        self._timer: threading.Timer | None = None
        _live.add(self)

    def note(self, expires_at: datetime, notes: Sequence[Note]) -> None:
        hour = _hour_of(expires_at)
        full: list[tuple[Note, datetime]] = []
        with self._mutex:
            if sum(map(len, self._pending.values())) + len(notes) > MAX_PENDING:
                log.warning("dedup expiry index: %d notes pending, dropped (the full sweep finds them)", len(notes))
                return
            pending = self._pending.setdefault(hour, [])
            pending += [(note, expires_at) for note in notes]
            if len(pending) >= NOTES_PER_ROW:  # a full row, taken here: exactly one writer writes it
                full, pending[:] = pending[:NOTES_PER_ROW], pending[NOTES_PER_ROW:]
            elif self._timer is None:
                self._timer = threading.Timer(FLUSH_AFTER, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if full:  # written beside the message path, not on it
            threading.Thread(target=self._write, args=(hour, full), daemon=True).start()

    def flush(self) -> int:
        """Write every pending note as index rows; requests made. Notes that could not be
        written stay pending for the next flush."""
        with self._mutex:
            taken, self._pending = self._pending, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return sum(self._write(hour, notes) for hour, notes in taken.items() if notes)

    def _write(self, hour: str, notes: list[tuple[Note, datetime]]) -> int:
        requests = 0
        for start in range(0, len(notes), NOTES_PER_ROW):
            for chunk, encoded in _fitting(notes[start : start + NOTES_PER_ROW]):
                now = utcnow()
                filed = max(hour, f"{now:{_HOUR}}")  # an hour that passed may be behind the cursor
                row = {"PartitionKey": self._prefix + filed, "RowKey": f"{now:%Y%m%d%H%M%S%f}-{uuid.uuid4().hex[:8]}",
                       "Notes": encoded,
                       "Until": max(expires for _, expires in chunk)}  # fmt: skip
                try:
                    with store_errors():
                        self._writes.insert(row)  # a retry after a lost answer meets our own row: fine, its key is ours
                    requests += 1
                except ResourceExistsError:
                    requests += 1
                except ResourceNotFoundError:  # the table is gone, and what the notes point to with it
                    log.debug("dedup expiry index: %d notes for a table that no longer exists", len(chunk))
                except (DedupError, HttpResponseError) as exc:  # e.g. a 409 other than "exists": kept
                    log.log(_quiet or logging.WARNING, "dedup expiry index: %d notes not written yet: %s",
                            len(chunk), exc)  # fmt: skip
                    with self._mutex:
                        self._pending.setdefault(hour, []).extend(chunk)
        return requests

    def purge(self, now: datetime, budget: int, deadline: float,
              delete: Callable[[str, list[Note]], tuple[int, int]]) -> Purge:  # fmt: skip
        """Delete what the index rows of the hours from the cursor to ``now`` noted, for rows
        whose every marker expired, a row at a time, until ``budget`` records are deleted (never
        one more: a row is purged in part, and keeps the rest of its notes for the next run)
        or ``deadline`` (time.monotonic()). The cursor moves past an hour once it is empty and
        settled. ``delete(partition, notes)`` deletes one partition's noted markers and guards:
        (records deleted, requests)."""
        requests = self.flush()
        with store_errors():
            cursor_row = {"pk": self._cursor["PartitionKey"], "rk": self._cursor["RowKey"]}
            stored = list(self._table.query_entities("PartitionKey eq @pk and RowKey eq @rk", parameters=cursor_row))
        requests += 1
        start = _hour(stored[0]["Hour"]) if stored else _floor(now - FIRST_PURGE)
        settled = _floor(now - SETTLE) - timedelta(hours=1)  # no note is filed there any more
        hour, cursor = start, start
        scanned = deleted = 0
        moving = True
        with ThreadPoolExecutor(self._concurrency) as pool:
            purged = functools.partial(self._purge_row, pool=pool, delete=delete)
            while hour <= now and deleted < budget and time.monotonic() < deadline:
                emptied = True
                for row in self._rows(self._table, "PartitionKey eq @pk", {"pk": self._prefix + f"{hour:{_HOUR}}"}):
                    if isinstance(row, int):  # a page was read
                        requests += row
                        continue
                    if deleted >= budget or time.monotonic() >= deadline:
                        emptied = False
                        break
                    if row["Until"] >= now:  # some of its markers are still inside their window
                        emptied = False
                        continue
                    done = purged(self._table, row, budget - deleted)
                    scanned, deleted = scanned + done.scanned, deleted + done.deleted
                    requests += done.requests
                    emptied = emptied and done.emptied
                moving = moving and emptied and hour <= settled
                if moving:
                    cursor = hour + timedelta(hours=1)
                hour += timedelta(hours=1)
        if cursor != start or not stored:
            with store_errors():
                self._writes.submit([("upsert", {**self._cursor, "Hour": f"{cursor:{_HOUR}}"}, REPLACE)])
            requests += 1
        return Purge(scanned, deleted, requests)

    def _purge_row(self, table: TableClient, row: dict[str, Any], room: int, *, pool: ThreadPoolExecutor,
                   delete: Callable[[str, list[Note]], tuple[int, int]]) -> _RowPurge:  # fmt: skip
        """Delete the noted records of a row that fell due, within ``room``, then the row, or
        rewrite it with the notes left."""
        # A note written twice (a retried write) is deleted once: a transaction holds each
        # entity once.
        notes = list(dict.fromkeys(Note(*n) for n in json.loads(row["Notes"])))
        taken, kept = within(notes, room)
        by_partition: dict[str, list[Note]] = {}
        for n in taken:
            by_partition.setdefault(n.partition, []).append(n)
        # Each worker takes a share of the partitions: a task per partition cost as much as its delete.
        partitions = [*by_partition.items()]
        shares = [partitions[n :: self._concurrency] for n in range(self._concurrency)]
        deleted = requests = 0
        for answers in pool.map(lambda share: [delete(*item) for item in share], [share for share in shares if share]):
            for done, made in answers:
                deleted, requests = deleted + done, requests + made
        requests += self._keep(row, kept)
        return _RowPurge(len(notes) - len(kept), deleted, requests, not kept)

    def _keep(self, row: dict[str, Any], kept: list[Note]) -> int:
        """Delete a row whose notes were all purged, or rewrite it with those ``kept`` for the
        next run; the request made. A row another run deleted meanwhile needs neither (the
        refusal, not_found, is its answer: every note it held is deleted or noted in its rewrite)."""
        keys = {"PartitionKey": str(row["PartitionKey"]), "RowKey": str(row["RowKey"])}
        rewritten = {**keys, "Notes": json.dumps(kept).encode(), "Until": row["Until"]}
        with store_errors():
            self._writes.submit([("update", rewritten, REPLACE)] if kept else [("delete", keys)])
        return 1

    @staticmethod
    def _rows(table: TableClient, query: str, parameters: dict[str, Any]) -> Iterator[dict[str, Any] | int]:
        """Index rows in key order (an hour's: as written), read ``PAGE`` rows at a time;
        before each page, 1 (a request made)."""
        found = table.query_entities(query, parameters=parameters, select=["PartitionKey", "RowKey", "Notes", "Until"],
                                     results_per_page=PAGE)  # fmt: skip
        with store_errors():
            for page in found.by_page():
                yield 1
                yield from (dict(row) for row in page)


class _RowPurge(NamedTuple):
    scanned: int  # notes purged (or passed over: their marker gone or rewritten)
    deleted: int
    requests: int
    emptied: bool  # the row deleted, no note left


def within(notes: Sequence[Note], room: int) -> tuple[list[Note], list[Note]]:
    """The notes whose records (a marker, and its guard) fit in ``room``, and those left for a
    later run. When one record is left for a note with a guard, the guard goes now (as a
    note of its own, deleted at any version, as guards are) and its marker stays noted."""
    taken: list[Note] = []
    for i, note in enumerate(notes):
        size = 2 if note.guard else 1
        if size <= room:
            taken.append(note)
            room -= size
        elif room == 1:  # the guard only: the marker still decides a late duplicate alone
            return [*taken, Note(note.partition, note.guard, "", "")], [note._replace(guard=""), *notes[i + 1 :]]
        else:
            return taken, list(notes[i:])
    return taken, []


def _fitting(notes: list[tuple[Note, datetime]]) -> Iterator[tuple[list[tuple[Note, datetime]], bytes]]:
    """The notes in rows whose property stays under 64 KiB (keys can be up to 1 KiB each),
    each with its encoded property."""
    encoded = json.dumps([note for note, _ in notes]).encode()
    if len(encoded) <= _ROW_BYTES or len(notes) == 1:
        yield notes, encoded
        return
    half = len(notes) // 2
    yield from _fitting(notes[:half])
    yield from _fitting(notes[half:])


def _floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _hour_of(moment: datetime) -> str:
    """``YYYYMMDDHH`` of an aware time's hour in UTC: exact arithmetic, then a lookup per hour
    rather than a strftime per note."""
    return _hour_text((moment - _EPOCH) // _ONE_HOUR)


@lru_cache(maxsize=64)
def _hour_text(number: int) -> str:
    return f"{_EPOCH + number * _ONE_HOUR:{_HOUR}}"


def _hour(text: object) -> datetime:
    return datetime.strptime(str(text), _HOUR).replace(tzinfo=UTC)


_live: weakref.WeakSet[ExpiryIndex] = weakref.WeakSet()


_quiet = 0  # at exit: what cannot be written is left to the full sweep, without a warning


@atexit.register
def _flush_at_exit() -> None:
    global _quiet
    _quiet = logging.DEBUG
    for index in list(_live):
        try:
            index.flush()
        except Exception:
            log.debug("dedup expiry index: notes left at exit", exc_info=True)
