"""Azure Table Storage store.

Layout: a marker is a sibling entity in the partition of the business entities it
guards (a Table transaction spans one table and one PartitionKey). Its RowKey is
``dedup|<scope>|<id>``; the atomic path also writes a *guard* ``<marker>|<fingerprint>``
first in the same transaction, so that the index of the failing operation tells, in
one request, "same payload" (the guard exists) from "different payload" (only the
marker exists).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import islice
from typing import Any
from urllib.parse import unquote

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceNotFoundError,
)
from azure.data.tables import (
    EdmType,
    TableClient,
    TableServiceClient,
    UpdateMode,
)

from ..config import DEAD_LETTER_RETENTION
from ..errors import StoreRefused, VersionConflict
from ..keys import DedupKey, encode_key, guard_id, marker_id
from ..messages import Change, Entity, Stored, utcnow
from ._azure import store_errors
from ._base import DedupStore, check_storable, refused
from ._codec import state_fingerprint
from ._expiry import INDEX, REPLACE, ExpiryIndex, Note
from ._records import (
    GUARD_KIND,
    MARKER_KIND,
    Commit,
    CommitResult,
    CommitStatus,
    Current,
    DeadLetter,
    Marker,
    Purge,
    State,
    StoredItem,
    StoredState,
)
from ._table_batch import TransactionFailure
from ._table_purge import delete_noted, purge_matching
from ._table_rows import (
    dead_letter_entities,
    dead_letter_records,
    effect_entity,
    effect_rows,
    marker_entity,
    marker_of,
)
from ._table_sdk import SdkTransactions, Transactions

log = logging.getLogger("idempotency")
MAX_TRANSACTION_OPERATIONS = 100  # Table entity-group transaction limit
STATE_VERSION = "StateVersion"  # the version of an entity written by upsert_if_newer
STATE_FINGERPRINT = "StateFingerprint"  # and the state_fingerprint of its data
STATE_OWNER = "StateOwner"  # and the token of the delivery that wrote it
_KEYS = ("PartitionKey", "RowKey")
CHANGE = -1  # the position of a chunk's change operation (each message's own count from 0: its guard)
BROKEN = "(broken)"  # an entity whose earlier change in this call failed: what follows it is decided again


class TableStore(DedupStore):
    folds_completions = True  # a step's completion: a replace at its ETag in the message's transaction
    commits_changes = True
    rows_per_read = 14  # a filter holds at most 15 comparisons: the partition's and 14 rows'

    def __init__(
        self,
        service: TableServiceClient,
        table: str,
        dead_letter_table: str = "deadletters",
        *,
        dead_letter_retention: timedelta = DEAD_LETTER_RETENTION,
        transactions: Transactions | None = None,
    ) -> None:
        """``transactions``: how it writes, the lean ``$batch`` transport (``_table_batch``) or,
        by default, the SDK's (``_table_sdk``)."""
        self.dead_letter_retention = dead_letter_retention
        self._service = service
        self._table: TableClient = service.get_table_client(table)
        self._dead: TableClient = service.get_table_client(dead_letter_table)
        self._transactions: Transactions = transactions or SdkTransactions(self._table)
        self._dead_transactions = self._transactions.sibling(self._dead)  # every write: one transport
        # Beside the markers it notes (the dead-letter table holds dead letters only), written
        # as the store writes.
        self._expiry = ExpiryIndex(self._table, table, writes=self._transactions)

    @property
    def table(self) -> TableClient:
        return self._table

    @property
    def dead_letter_table(self) -> str:
        return self._dead.table_name

    def check_tables(self) -> None:
        for client in (self._table, self._dead):  # one small query each: it 404s only for a missing table
            with store_errors(client.table_name, writes=True):  # (TableNotFound; Cosmos DB: ResourceNotFound)
                next(iter(client.query_entities("PartitionKey eq @pk", parameters={"pk": "~"}, results_per_page=1)),
                     None)  # fmt: skip

    def create_tables(self) -> None:
        with store_errors():
            for client in (self._table, self._dead):
                self._service.create_table_if_not_exists(client.table_name)

    # -- atomic path ---------------------------------------------------------------------

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        """Messages sharing a partition are committed together, in transactions of up to
        100 operations. A transaction that fails on one message's operation drops that
        message (the failing index says duplicate or mismatch) and goes again with the
        rest. The same key twice in one call: the later copy waits for a later round."""
        results: dict[int, CommitResult] = {}
        remaining = []
        chained: dict[tuple[str, str], str | None] = {}  # (partition, entity): the version this call wrote
        rows: dict[int, list[dict[str, Any]]] = {}  # each message's effects as entities, checked once
        for i, commit in enumerate(commits):
            try:
                rows[i] = effect_rows(encode_key(commit.partition), commit.effects)
                if commit.changes:
                    self.check_effects(changed_entities(commit))
                remaining.append(i)
            except (TypeError, StoreRefused) as exc:  # refused before anything is sent
                results[i] = refused(exc)
        while remaining:
            keys: set[DedupKey] = set()
            this_round: list[int] = []
            later: list[int] = []
            for i in remaining:
                (later if commits[i].key in keys else this_round).append(i)
                keys.add(commits[i].key)
            groups: dict[str, list[int]] = {}
            for i in this_round:
                groups.setdefault(commits[i].partition, []).append(i)
            for partition, members in groups.items():
                for chunk in _chunks(commits, members):
                    results.update(self._transact(commits, rows, partition, chunk, chained))
            remaining = later
        return [results[i] for i in range(len(commits))]

    def _submit(self, operations: list[Any]) -> TransactionFailure | list[str]:
        """One transaction (the SDK's operation tuples, or a bare entity for an insert): each
        operation's ETag when applied; the refused operation when one met an existing entity,
        another version or none (nothing written); other errors raise. Not resent by the
        retry policy: a resend after a lost answer meets our own guard, so the consumer's
        waiting loop resends, knowing to read the marker back."""
        return self._transactions.submit(operations, retry_total=0)

    def _transact(self, commits: Sequence[Commit], rows: dict[int, list[dict[str, Any]]], partition: str,
                  chunk: list[int], chained: dict[tuple[str, str], str | None]) -> dict[int, CommitResult]:  # fmt: skip
        results: dict[int, CommitResult] = {}
        pk, now = encode_key(partition), utcnow()
        while chunk:
            broken = [i for i in chunk if any(chained.get((partition, c.name)) == BROKEN for c in commits[i].changes)]
            results.update({i: CommitResult(CommitStatus.CONTENDED) for i in broken})  # what it followed failed
            chunk = [i for i in chunk if i not in broken]
            if not chunk:
                break
            operations: list[Any] = []
            owners: list[tuple[int, int]] = []  # per operation: (message, position in the message)
            firsts: dict[int, int] = {}  # per message: its first operation (its guard; the marker follows)
            for i in chunk:
                commit, firsts[i] = commits[i], len(operations)
                guard = {"PartitionKey": pk, "RowKey": guard_id(commit.key, commit.fingerprint), "Kind": GUARD_KIND,
                         "ExpiresAt": commit.expires_at}  # fmt: skip
                entities = [guard, self._marker_entity(commit.marker(now)), *rows[i]]
                operations += entities  # bare entities: inserts
                operations += [("update", self._marker_entity(step), _at_version(step.version))
                               for step in commit.completions]  # fmt: skip
                owners += [(i, position) for position in range(len(entities) + len(commit.completions))]
            last = {c.name: (i, c) for i in chunk for c in commits[i].changes}  # each entity as the chunk leaves it
            changes = {name: len(operations) + n for n, name in enumerate(last)}
            operations += [self._change(pk, change, chained.get((partition, name), change.etag))
                           for name, (_, change) in last.items()]  # fmt: skip
            owners += [(i, CHANGE) for i, _ in last.values()]
            try:
                with store_errors(self._table.table_name, writes=True):
                    answer = self._submit(operations)
            except StoreRefused as exc:  # a value too large, say: whose? each message on its own
                if len(chunk) == 1:
                    return {**results, chunk[0]: refused(exc)}
                answer = TransactionFailure(None, 400, "", str(exc))
            if isinstance(answer, TransactionFailure):
                failed = answer.index if answer.index is not None and 0 <= answer.index < len(owners) else None
                if failed is None and len(chunk) > 1:  # the service did not say which: one by one
                    for i in chunk:
                        results.update(self._transact(commits, rows, partition, [i], chained))
                    return results
                i, position = owners[failed] if failed is not None else (chunk[0], None)
                if position == CHANGE or commits[i].changes:  # an entity moved, or a commit folded in failed
                    folded = [j for j in chunk if commits[j].changes and (j != i or position == CHANGE)]
                    for j in folded:
                        results[j] = CommitResult(CommitStatus.CONTENDED)
                        chained.update({(partition, c.name): BROKEN for c in commits[j].changes})
                    chunk = [j for j in chunk if j not in folded]
                    if position == CHANGE:
                        continue
                if answer.version_conflict or answer.not_found:  # at a completion: its claim was taken over
                    results[i] = CommitResult(CommitStatus.LEASE_LOST)
                else:
                    results[i] = self.conflict(commits[i], guard_exists=position == 0)
                chunk = [j for j in chunk if j != i]
                continue
            for name, n in changes.items():
                chained[(partition, name)] = None if last[name][1].data is None else answer[n]
            for i in chunk:  # each message's operations: guard, marker, effects, completions
                first, commit = firsts[i], commits[i]
                guard_key, marker_key = operations[first]["RowKey"], operations[first + 1]["RowKey"]
                notes = [Note(pk, marker_key, answer[first + 1], guard_key)]
                steps = first + 2 + len(commit.effects)
                notes += [Note(pk, operations[steps + n][1]["RowKey"], answer[steps + n], "")
                          for n in range(len(commit.completions))]  # fmt: skip
                self._expiry.note(commit.expires_at, notes)
            results.update({i: CommitResult(CommitStatus.NEW, commits[i].fingerprint) for i in chunk})
            break
        return results

    # -- two-phase primitives ------------------------------------------------------------

    def _change(self, pk: str, change: Change, etag: str | None) -> Any:
        """The operation of one change: created (no version), deleted or replaced at ``etag``."""
        if change.data is None:
            return ("delete", {"PartitionKey": pk, "RowKey": encode_key(change.name)},
                    {"etag": etag, "match_condition": MatchConditions.IfNotModified})  # fmt: skip
        entity = self.effect_entity(pk, Entity(change.name, change.data))
        return entity if etag is None else ("update", entity, _at_version(etag))

    def read_current(self, partition: str, keys: Sequence[DedupKey], names: Sequence[str]) -> Current:
        """One query per ``rows_per_read`` rows, the keys as parameters (never in the filter's text)."""
        pk = encode_key(partition)
        wanted = [*(marker_id(key) for key in keys), *(encode_key(name) for name in names)]
        rows: dict[str, Any] = {}
        for start in range(0, len(wanted), self.rows_per_read):
            group = wanted[start : start + self.rows_per_read]
            either = " or ".join(f"RowKey eq @r{n}" for n in range(len(group)))
            parameters = {"pk": pk, **{f"r{n}": row for n, row in enumerate(group)}}
            with store_errors(self._table.table_name):
                found = self._transactions.query(f"PartitionKey eq @pk and ( {either} )", parameters, len(group))
            rows.update((row["RowKey"], row) for row in found)
        markers = {key: self._marker_from(rows[marker_id(key)], partition) for key in keys if marker_id(key) in rows}
        entities = {}
        for name in names:
            row = rows.get(encode_key(name))
            data = None if row is None else {k: getattr(v, "value", v) for k, v in row.items() if k not in _KEYS}
            entities[name] = Stored(name, data, None if row is None else str(row.metadata["etag"]))
        return Current(markers, entities)

    def get(self, key: DedupKey, partition: str) -> Marker | None:
        try:  # a missing table is a ConfigurationError naming it (store_errors), not "no marker"
            with store_errors(self._table.table_name):
                entity = self._table.get_entity(encode_key(partition), marker_id(key))
        except ResourceNotFoundError:
            return None
        return self._marker_from(entity, partition)

    def insert(self, marker: Marker) -> Marker | None:
        with store_errors(self._table.table_name, writes=True):
            etag = self._transactions.insert(self._marker_entity(marker))
        return None if etag is None else self._noted(replace(marker, version=etag))

    def replace(self, marker: Marker, if_version: str) -> Marker:
        with store_errors(self._table.table_name, writes=True):
            answer = self._transactions.submit([("update", self._marker_entity(marker), _at_version(if_version))])
        if isinstance(answer, TransactionFailure):  # changed or gone since it was read
            raise VersionConflict(answer.message)
        return self._noted(replace(marker, version=answer[0]))

    def _noted(self, marker: Marker) -> Marker:
        """A final marker goes to the expiry index at its version (a claim is noted once final)."""
        if marker.final:
            self._expiry.note(marker.expires_at, [Note(encode_key(marker.partition), marker_id(marker.key),
                                                       marker.version or "", "")])  # fmt: skip
        return marker

    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        # Markers live beside the business data, in every partition: this is a filtered
        # scan, bounded by ``limit``; run it from a timer, never on the message path.
        query = self._table.query_entities(
            "Kind eq @kind and State eq @state and LeaseUntil lt @cutoff",
            parameters={"kind": MARKER_KIND, "state": State.IN_PROGRESS.value, "cutoff": lease_expired_before},
            results_per_page=min(limit, 1000),
        )
        with store_errors(self._table.table_name):
            return [self._marker_from(entity, entity["Partition"]) for entity in islice(query, limit)]

    def sequenced(self, scope: str, since: datetime, until: datetime) -> list[Marker]:
        query = self._table.query_entities(
            "Kind eq @kind and EnqueuedAt ge @since and EnqueuedAt lt @until"
            " and ( Scope eq @scope or ( Scope gt @own and Scope lt @past ) )",  # scope|…: "}" follows "|"; the
            # SDK substitutes a parameter only when it stands between spaces
            parameters={
                "kind": MARKER_KIND,
                "since": since,
                "until": until,
                "scope": scope,
                "own": scope + "|",
                "past": scope + "}",
            },
            select=[
                "Scope",
                "KeyId",
                "Step",
                "State",
                "Fingerprint",
                "CreatedAt",
                "ExpiresAt",
                "Sequence",
                "EnqueuedAt",
                "PartitionKey",
            ],
            results_per_page=1000,
        )
        with store_errors(self._table.table_name):
            return [self._marker_from(entity, entity["PartitionKey"]) for entity in query]

    # -- naturally idempotent writes ----------------------------------------------------

    def read_state(self, partition: str, name: str) -> StoredState | None:
        try:
            with store_errors(self._table.table_name):
                current = self._table.get_entity(encode_key(partition), encode_key(name),
                                                 select=[STATE_VERSION, STATE_FINGERPRINT, STATE_OWNER])  # fmt: skip
        except ResourceNotFoundError:
            return None
        stored = current.get(STATE_VERSION)
        stored = getattr(stored, "value", stored)  # Edm.Int64 is read back typed
        return StoredState(-1 if stored is None else int(stored), str(current.metadata["etag"]),
                           current.get(STATE_FINGERPRINT), current.get(STATE_OWNER))  # fmt: skip

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        # Int64 always: versions go up to 2**53 - 1 (JSON's exact integers), past Int32's range.
        body = {**self.effect_entity(encode_key(partition), entity), STATE_VERSION: (version, EdmType.INT64),
                STATE_FINGERPRINT: state_fingerprint(entity.data),
                **({STATE_OWNER: owner} if owner else {})}  # fmt: skip
        with store_errors(self._table.table_name, writes=True):
            if if_etag is None:
                return self._transactions.insert(body) is not None  # None: another writer created it first
            answer = self._transactions.submit([("update", body, _at_version(if_etag))])
        return not isinstance(answer, TransactionFailure)  # refused: it moved, or went, meanwhile

    # -- lifecycle -----------------------------------------------------------------------

    def purge_expired(self, now: datetime, budget: int, *, deadline: float | None = None) -> Purge:
        """Follows the expiry index (_expiry.py): reads the hours that fell due, deletes each
        noted marker at its noted version with its guard, one transaction per business
        partition, in parallel, until ``budget`` records are deleted or ``deadline``
        (time.monotonic()). Then the dead-letter records that expired (their own table)."""
        deadline = time.monotonic() + 3600 if deadline is None else deadline
        markers = self._expiry.purge(now, budget, deadline, self._delete_noted)
        dead = purge_matching(self._dead, self._dead_transactions.submit, "ExpiresAt lt @now", {"now": now},
                              budget - markers.deleted, deadline)  # fmt: skip
        return Purge(markers.scanned + dead.scanned, markers.deleted + dead.deleted, markers.requests + dead.requests)

    def sweep_expired(self, now: datetime, budget: int) -> Purge:
        """The rare full sweep, for what the index missed: a filtered scan of the whole table
        (continuation tokens, pages of 1,000) for markers and guards (the index's rows have no
        ``Kind``: never matched); within a page, grouped by partition and deleted in
        transactions of up to 100, each conditional on the ETag read, so that a marker
        rewritten meanwhile (a takeover) is kept."""
        return purge_matching(
            self._table,
            self._submit,
            "( Kind eq @marker or Kind eq @guard ) and ExpiresAt lt @now",  # the SDK splits on spaces
            {"marker": MARKER_KIND, "guard": GUARD_KIND, "now": now},
            budget,
        )

    def _delete_noted(self, pk: str, notes: list[Note]) -> tuple[int, int]:
        return delete_noted(self._submit, pk, notes)

    # -- the library's own records beside the data ------------------------------------------

    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        # encode_key maps character by character (names here are short): an encoded prefix
        # is a prefix of every encoded name it starts, and "~" sorts after each character
        # an encoded name holds.
        low = encode_key(prefix) if prefix else ""
        between, bounds = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high", {"low": low, "high": low + "~"}
        with store_errors(self._table.table_name):
            rows = self._transactions.query(between, {"pk": encode_key(partition), **bounds}, limit)
        return [Entity(unquote(row["RowKey"]), {k: v for k, v in row.items() if k not in _KEYS})
                for row in rows if row.get("Kind") not in (MARKER_KIND, GUARD_KIND)]  # fmt: skip

    def put_entity(self, partition: str, entity: Entity) -> None:
        check_storable([entity])
        self._write(self._transactions, [("upsert", self.effect_entity(encode_key(partition), entity), REPLACE)],
                    self._table)  # fmt: skip

    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        """One transaction per 100 names (the outbox sweep's index rows); a transaction that
        met a name gone already (all or nothing) goes again without it — or, when the service
        did not say which (a 404 without an index), each name on its own."""
        key = encode_key(partition)
        for start in range(0, len(names), MAX_TRANSACTION_OPERATIONS):
            chunk = [("delete", {"PartitionKey": key, "RowKey": encode_key(name)})
                     for name in names[start : start + MAX_TRANSACTION_OPERATIONS]]  # fmt: skip
            while chunk:
                with store_errors(self._table.table_name, writes=True):
                    answer = self._transactions.submit(chunk)
                if not isinstance(answer, TransactionFailure):
                    break
                if not answer.not_found:
                    raise StoreRefused(f"deleting {len(chunk)} entities of {partition!r}: {answer.message}")
                if answer.index is None or not 0 <= answer.index < len(chunk):
                    for one in chunk if len(chunk) > 1 else ():  # which one is gone? each on its own
                        with store_errors(self._table.table_name, writes=True):
                            alone = self._transactions.submit([one])
                        if isinstance(alone, TransactionFailure) and not alone.not_found:
                            raise StoreRefused(f"deleting an entity of {partition!r}: {alone.message}")
                    break  # gone already, the one or those left
                del chunk[answer.index]

    def _write(self, transactions: Transactions, operations: list[Any], table: TableClient) -> None:
        """Writes that cannot meet a decided refusal (upserts) to ``table``: applied, or an error raised."""
        with store_errors(table.table_name, writes=True):
            answer = transactions.submit(operations)
        if isinstance(answer, TransactionFailure):
            raise StoreRefused(f"{len(operations)} writes refused: {answer.message}")

    # -- dead letters --------------------------------------------------------------------

    def dead_letter(self, record: DeadLetter) -> None:
        """One entity, or (a body past its 10 chunks) the record's entity and its parts in one
        entity-group transaction: never half a record."""
        self._write(self._dead_transactions, [("upsert", e, REPLACE) for e in self._dead_letter_entities(record)],
                    self._dead)  # fmt: skip

    def _dead_letter_entities(self, record: DeadLetter) -> list[dict[str, Any]]:
        return dead_letter_entities(record, self.dead_letter_retention, utcnow())

    def dead_letters(self, scope: str) -> list[DeadLetter]:
        query = self._dead.query_entities("PartitionKey eq @pk", parameters={"pk": encode_key(scope)})
        with store_errors(self._dead.table_name):
            return dead_letter_records(list(query))

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        if partition is None:
            entities = self._table.list_entities()
        else:
            entities = self._table.query_entities("PartitionKey eq @pk", parameters={"pk": encode_key(partition)})
        with store_errors(self._table.table_name):
            for entity in entities:
                if entity["PartitionKey"].startswith(INDEX):  # the expiry index's: no record of the data
                    continue
                kind = entity.get("Kind")
                key = (
                    DedupKey(entity["Scope"], entity["KeyId"], entity.get("Step") or "")
                    if kind == MARKER_KIND
                    else None
                )
                name = None if kind else unquote(entity["RowKey"])
                yield StoredItem(entity["RowKey"], kind, key, name, dict(entity))

    # -- entity mapping (_table_rows) -------------------------------------------------------

    _marker_entity = staticmethod(marker_entity)
    effect_entity = staticmethod(effect_entity)
    _marker_from = staticmethod(marker_of)

    def check_effects(self, effects: Sequence[Entity]) -> None:
        effect_rows("", effects)


def _at_version(etag: str | None) -> dict[str, Any]:
    """A replace only at ``etag``: the fence of a step's completion, of a changed state."""
    return {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified}


def changed_entities(commit: Commit) -> list[Entity]:
    return [Entity(change.name, change.data) for change in commit.changes if change.data is not None]


def _chunks(commits: Sequence[Commit], members: list[int]) -> Iterator[list[int]]:
    """Whole messages per transaction, at most 100 operations (guard + marker + effects, and
    each entity the chunk changes, once)."""
    chunk: list[int] = []
    operations = 0
    changed: set[str] = set()
    for i in members:
        names = {change.name for change in commits[i].changes}
        size = len(commits[i].effects) + len(commits[i].completions) + 2
        if size + len(names) > MAX_TRANSACTION_OPERATIONS:
            raise ValueError(f"a Table transaction holds at most {MAX_TRANSACTION_OPERATIONS - 2} effects and steps")
        if chunk and operations + size + len(names - changed) > MAX_TRANSACTION_OPERATIONS:
            yield chunk
            chunk, operations, changed = [], 0, set()
        chunk.append(i)
        operations += size + len(names - changed)
        changed |= names
    if chunk:
        yield chunk
