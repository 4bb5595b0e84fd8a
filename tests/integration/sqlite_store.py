"""A store of another kind, on the standard library's sqlite3, written from docs/stores.md
("Writing your own store") with public names only: it proves that the store author's face
is enough. One table holds markers, guards and business entities by (partition, name);
another the dead-letter records. One connection, one lock: every call is one transaction.
An example for tests, not a store to deploy."""

import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.idempotency.stores import (
    GUARD_KIND,
    MARKER_KIND,
    Commit,
    CommitResult,
    CommitStatus,
    DeadLetter,
    DedupKey,
    DedupStore,
    Entity,
    Marker,
    Purge,
    State,
    StoredItem,
    StoredState,
    StoreRefused,
    StoreUnavailable,
    VersionConflict,
    check_storable,
    dead_letter_fields,
    dead_letter_from,
    encode_key,
    guard_id,
    kept,
    marker_fields,
    marker_from,
    marker_id,
    refused,
    state_fingerprint,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    partition TEXT NOT NULL, name TEXT NOT NULL, kind TEXT, entity TEXT, fields TEXT NOT NULL,
    etag TEXT NOT NULL, expires REAL, state_version INTEGER, state_fingerprint TEXT, state_owner TEXT,
    PRIMARY KEY (partition, name));
CREATE TABLE IF NOT EXISTS dead_letters (
    scope TEXT NOT NULL, record_id TEXT NOT NULL, fields TEXT NOT NULL, body BLOB NOT NULL,
    expires REAL NOT NULL, PRIMARY KEY (scope, record_id));
"""
INSERT = "INSERT INTO items (partition, name, kind, entity, fields, etag, expires) VALUES (?, ?, ?, ?, ?, ?, ?)"


def dump(fields: dict[str, Any]) -> str:
    """JSON text of a record's fields; times and bytes (top-level only: check_storable) tagged."""

    def tagged(value: Any) -> list[Any]:
        if isinstance(value, datetime):
            return ["t", value.isoformat()]
        return ["b", value.hex()] if isinstance(value, bytes) else ["j", value]

    return json.dumps({name: tagged(value) for name, value in fields.items()})


def load(text: str) -> dict[str, Any]:
    decode: dict[str, Callable[[Any], Any]] = {"t": datetime.fromisoformat, "b": bytes.fromhex, "j": lambda v: v}
    return {name: decode[tag](value) for name, (tag, value) in json.loads(text).items()}


def etag() -> str:
    return uuid.uuid4().hex  # never reused, even by a row deleted and written again


class SqliteStore(DedupStore):
    folds_completions = True  # a commit's transaction also completes its steps, each at its version

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        self._db: sqlite3.Connection | None = None  # opened on first use: a bad path fails the calls
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction (rolled back on any error); a database that cannot be opened or is
        busy is StoreUnavailable, as a server that does not answer."""
        with self._lock:
            try:
                if self._db is None:
                    self._db = sqlite3.connect(self._path, check_same_thread=False)
                    self._db.executescript(SCHEMA)
                with self._db:
                    yield self._db
            except sqlite3.OperationalError as exc:
                raise StoreUnavailable(f"sqlite {self._path}: {exc}") from exc

    # -- the atomic path --------------------------------------------------------------------

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        return [self._commit(commit) for commit in commits]

    def _commit(self, commit: Commit) -> CommitResult:
        names = [encode_key(effect.name) for effect in commit.effects]
        try:
            if len(names) > self.max_effects or len(set(names)) < len(names):
                raise ValueError(f"a commit holds at most {self.max_effects} entities, each name once")
            self.check_effects(commit.effects)
        except (ValueError, TypeError, StoreRefused) as exc:
            return refused(exc)
        partition, expires = encode_key(commit.partition), commit.expires_at.timestamp()
        guard, marker = guard_id(commit.key, commit.fingerprint), commit.marker(datetime.now(UTC))
        rows = [(partition, guard, GUARD_KIND, None, "{}", etag(), expires),
                (partition, marker_id(commit.key), MARKER_KIND, None, dump(marker_fields(marker)), etag(), expires),
                *((partition, name, None, e.name, dump(e.data), etag(), None)
                  for name, e in zip(names, commit.effects, strict=True))]  # fmt: skip
        with self._transaction() as db:
            ids = [guard, marker_id(commit.key), *names]
            taken = {row[0] for row in db.execute(
                f"SELECT name FROM items WHERE partition = ? AND name IN ({', '.join('?' * len(ids))})",
                (partition, *ids))}  # fmt: skip
            if not taken:
                for step in commit.completions:  # completed step markers, each at its claim's version
                    if self._write_marker(db, step, step.version or "") is None:
                        db.rollback()  # taken over: nothing of this commit is written
                        return CommitResult(CommitStatus.LEASE_LOST)
                db.executemany(INSERT, rows)
                return CommitResult(CommitStatus.NEW, commit.fingerprint)
        return self.conflict(commit, guard_exists=guard in taken)

    # -- the two-phase path -----------------------------------------------------------------

    def get(self, key: DedupKey, partition: str) -> Marker | None:
        with self._transaction() as db:
            row = db.execute("SELECT fields, etag FROM items WHERE partition = ? AND name = ?",
                             (encode_key(partition), marker_id(key))).fetchone()  # fmt: skip
        return marker_from(load(row[0]), partition, row[1]) if row else None

    def insert(self, marker: Marker) -> Marker | None:
        version = etag()
        try:
            with self._transaction() as db:
                db.execute(INSERT, (encode_key(marker.partition), marker_id(marker.key), MARKER_KIND, None,
                                    dump(marker_fields(marker)), version, marker.expires_at.timestamp()))  # fmt: skip
        except sqlite3.IntegrityError:
            return None  # a marker of this key exists
        return replace(marker, version=version)

    def replace(self, marker: Marker, if_version: str) -> Marker:
        with self._transaction() as db:
            version = self._write_marker(db, marker, if_version)
        if version is None:
            raise VersionConflict(f"{marker.key}: not at version {if_version}")
        return replace(marker, version=version)

    def _write_marker(self, db: sqlite3.Connection, marker: Marker, if_version: str) -> str | None:
        version, place = etag(), (encode_key(marker.partition), marker_id(marker.key))
        written = db.execute("UPDATE items SET fields = ?, etag = ?, expires = ? WHERE partition = ? AND name = ? "
                             "AND etag = ?", (dump(marker_fields(marker)), version, marker.expires_at.timestamp(),
                                              *place, if_version))  # fmt: skip
        return version if written.rowcount == 1 else None

    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        with self._transaction() as db:
            rows = db.execute("SELECT fields, etag FROM items WHERE kind = ?", (MARKER_KIND,)).fetchall()
        markers = [marker_from(data, data.get("partition", ""), version)  # a claim carries its raw partition
                   for data, version in ((load(fields), version) for fields, version in rows)]  # fmt: skip
        return [m for m in markers if m.state is State.IN_PROGRESS and m.lease_until
                and m.lease_until < lease_expired_before][:limit]  # fmt: skip

    def sequenced(self, scope: str, since: datetime, until: datetime) -> list[Marker]:
        with self._transaction() as db:
            rows = db.execute("SELECT fields, etag FROM items WHERE kind = ?", (MARKER_KIND,)).fetchall()
        markers = [marker_from(load(fields), "", version) for fields, version in rows]
        return [m for m in markers if m.enqueued_at is not None and since <= m.enqueued_at < until
                and m.key.scope.split("|", 1)[0] == scope]  # fmt: skip

    # -- versioned state ----------------------------------------------------------------------

    def read_state(self, partition: str, name: str) -> StoredState | None:
        with self._transaction() as db:
            row = db.execute("SELECT state_version, etag, state_fingerprint, state_owner FROM items "
                             "WHERE partition = ? AND name = ?",
                             (encode_key(partition), encode_key(name))).fetchone()  # fmt: skip
        return StoredState(-1 if row[0] is None else row[0], row[1], row[2], row[3]) if row else None

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        check_storable([entity])
        values = (dump(entity.data), etag(), version, state_fingerprint(entity.data), owner)
        place = (encode_key(partition), encode_key(entity.name))
        try:
            with self._transaction() as db:
                if if_etag is None:
                    db.execute("INSERT INTO items (fields, etag, state_version, state_fingerprint, state_owner, "
                               "partition, name, entity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (*values, *place, entity.name))  # fmt: skip
                    return True
                return db.execute("UPDATE items SET fields = ?, etag = ?, state_version = ?, state_fingerprint = ?, "
                                  "state_owner = ? WHERE partition = ? AND name = ? AND etag = ?",
                                  (*values, *place, if_etag)).rowcount == 1  # fmt: skip
        except sqlite3.IntegrityError:
            return False  # another writer created it first

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letter(self, record: DeadLetter) -> None:
        recorded = record.recorded_at or datetime.now(UTC)
        expires = recorded + self.dead_letter_retention
        stored = kept(record)  # a body past MAX_DEAD_LETTER_BODY: its head, length and SHA-256
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO dead_letters VALUES (?, ?, ?, ?, ?)",
                       (record.scope, record.record_id, dump(dead_letter_fields(stored, recorded, expires)),
                        stored.body, expires.timestamp()))  # fmt: skip

    def dead_letters(self, scope: str) -> list[DeadLetter]:
        with self._transaction() as db:
            rows = db.execute("SELECT fields, body FROM dead_letters WHERE scope = ?", (scope,)).fetchall()
        return [dead_letter_from(load(fields), body) for fields, body in rows]

    # -- the library's own records beside the data ---------------------------------------------

    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        with self._transaction() as db:
            rows = db.execute("SELECT entity, fields FROM items WHERE partition = ? AND entity IS NOT NULL AND "
                              "substr(entity, 1, ?) = ? ORDER BY entity LIMIT ?",
                              (encode_key(partition), len(prefix), prefix, limit)).fetchall()  # fmt: skip
        return [Entity(name, load(fields)) for name, fields in rows]

    def put_entity(self, partition: str, entity: Entity) -> None:
        check_storable([entity])
        row = (encode_key(partition), encode_key(entity.name), entity.name, dump(entity.data), etag())
        with self._transaction() as db:
            db.execute("REPLACE INTO items (partition, name, entity, fields, etag) VALUES (?, ?, ?, ?, ?)", row)

    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM items WHERE partition = ? AND name = ? AND entity IS NOT NULL",
                           [(encode_key(partition), encode_key(name)) for name in names])  # fmt: skip

    # -- lifecycle and verification ---------------------------------------------------------------

    def purge_expired(self, now: datetime, budget: int, *, deadline: float | None = None) -> Purge:
        """Markers and guards (business entities have no expiry), then dead letters."""
        deleted = 0
        with self._transaction() as db:
            for table in ("items", "dead_letters"):
                expired = f"SELECT rowid FROM {table} WHERE expires < ? LIMIT ?"
                deleted += db.execute(f"DELETE FROM {table} WHERE rowid IN ({expired})",
                                      (now.timestamp(), budget - deleted)).rowcount  # fmt: skip
        return Purge(deleted, deleted, 1)

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        query = "SELECT name, kind, entity, fields FROM items" + ("" if partition is None else " WHERE partition = ?")
        with self._transaction() as db:
            rows = db.execute(query, () if partition is None else (encode_key(partition),)).fetchall()
        for name, kind, entity, fields in rows:
            data = load(fields)
            yield StoredItem(name, kind, marker_from(data, "", None).key if kind == MARKER_KIND else None, entity, data)
