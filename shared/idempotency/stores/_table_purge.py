"""The Table store's deletes of what expired: the noted markers with their guards (the
expiry index's purge), and whatever a filtered query matches (the full sweep, expired dead
letters), each delete conditional on the version it was noted or read at."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableClient

from ..errors import StoreRefused
from ._azure import store_errors
from ._expiry import Note
from ._records import Purge
from ._table_batch import TransactionFailure

log = logging.getLogger("idempotency")
MAX_TRANSACTION_OPERATIONS = 100  # Table entity-group transaction limit


Submit = Callable[[list[Any]], TransactionFailure | list[str]]  # one transaction (TableStore._submit)


def delete_noted(submit: Submit, pk: str, notes: list[Note]) -> tuple[int, int]:
    """Delete noted markers (at their noted version) with their guards: (deleted, requests).
    A marker rewritten since is kept with its guard; one already gone is passed over."""
    deleted = made = 0
    for start in range(0, len(notes), MAX_TRANSACTION_OPERATIONS // 2):
        operations: list[Any] = []
        for note in notes[start : start + MAX_TRANSACTION_OPERATIONS // 2]:
            at = {"etag": note.etag, "match_condition": MatchConditions.IfNotModified} if note.etag else {}
            operations.append(("delete", {"PartitionKey": pk, "RowKey": note.marker}, at))
            if note.guard:
                operations.append(("delete", {"PartitionKey": pk, "RowKey": note.guard}, {}))
        while operations:
            try:
                with store_errors():
                    answer = submit(operations)
            except StoreRefused as exc:  # never expected: left to the full sweep, the purge goes on
                log.warning("dedup purge: %d deletes refused in %s (the sweep's): %s", len(operations), pk, exc)
                break
            made += 1
            if not isinstance(answer, TransactionFailure):
                deleted += len(operations)
                break
            if answer.index is None or not 0 <= answer.index < len(operations):
                if answer.not_found or answer.version_conflict:  # the service did not say which: each alone
                    alone, requests = _one_by_one(submit, notes, operations)
                    deleted, made = deleted + alone, made + requests
                break  # else neither gone nor rewritten: the full sweep will
            failed = operations[answer.index]
            if answer.version_conflict:  # the marker was rewritten: keep it and its guard
                guard = _guard_of(notes, failed[1]["RowKey"])
                operations = [op for op in operations if op[1]["RowKey"] not in (failed[1]["RowKey"], guard)]
            else:  # gone already
                operations = [op for op in operations if op is not failed]
    return deleted, made


def _one_by_one(submit: Submit, notes: list[Note], operations: list[Any]) -> tuple[int, int]:
    """Each delete in a transaction of its own (a marker before its guard): (deleted, requests).
    A marker rewritten since keeps its guard; one gone already, and any other refusal, is passed
    over (the full sweep's)."""
    deleted = made = 0
    kept: set[str] = set()  # the guards of markers rewritten since
    for operation in operations:
        row = operation[1]["RowKey"]
        if row in kept:
            continue
        try:
            with store_errors():
                answer = submit([operation])
        except StoreRefused as exc:  # never expected: passed over, for the full sweep
            log.warning("dedup purge: a delete refused in its partition (the sweep's): %s", exc)
            continue
        made += 1
        if not isinstance(answer, TransactionFailure):
            deleted += 1
        elif answer.version_conflict and (guard := _guard_of(notes, row)):
            kept.add(guard)
    return deleted, made


def _guard_of(notes: list[Note], marker: str) -> str | None:
    return next((note.guard for note in notes if note.marker == marker), None)


def purge_matching(table: TableClient, submit: Submit, query: str, parameters: dict[str, Any], budget: int,
                   deadline: float | None = None) -> Purge:  # fmt: skip
    """Delete what ``query`` matches in ``table``, page by page (1,000), grouped by partition in
    transactions of up to 100 (``submit``: the store's transport), each conditional on the ETag
    read."""
    found = table.query_entities(query, parameters=parameters, select=["PartitionKey", "RowKey"],
                                 results_per_page=1000)  # fmt: skip
    scanned = deleted = requests = 0
    with store_errors():
        for page in found.by_page():
            if deleted >= budget or (deadline is not None and time.monotonic() >= deadline):
                break
            requests += 1
            by_partition: dict[str, list[Any]] = {}
            for entity in page:
                scanned += 1
                if deleted + sum(map(len, by_partition.values())) < budget:
                    by_partition.setdefault(entity["PartitionKey"], []).append(entity)
            for entities in by_partition.values():
                for start in range(0, len(entities), MAX_TRANSACTION_OPERATIONS):
                    chunk = entities[start : start + MAX_TRANSACTION_OPERATIONS]
                    deleted += _delete_unchanged(submit, chunk)
                    requests += 1
    return Purge(scanned, deleted, requests)


def _delete_unchanged(submit: Submit, entities: list[Any]) -> int:
    operations: list[Any] = [
        ("delete", e, {"etag": e.metadata["etag"], "match_condition": MatchConditions.IfNotModified}) for e in entities
    ]
    if isinstance(submit(operations), TransactionFailure):
        return 0  # one of them changed or vanished since the scan: the next run retries
    return len(entities)
