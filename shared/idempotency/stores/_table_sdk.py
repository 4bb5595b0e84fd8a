"""The Table store's writes and its partitions' queries through the Azure SDK
(``TableClient.submit_transaction``, ``create_entity``, ``query_entities``): the default
transport. ``_table_batch.TableTransactions`` is the lean one, the same calls in fewer
instructions; the store is given one at construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any, Protocol

import requests
import urllib3
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, TableEntity, TableTransactionError

from ._azure import error_code
from ._table_batch import Operation, TransactionFailure, operation_kind, resendable


class Transactions(Protocol):
    """How a Table store writes, and reads its partitions' rows: ``submit`` one entity-group
    transaction (each operation's new ETag, or the refusal the caller decides on); ``insert``
    one entity (its ETag, None when it already existed); ``query``. Other refusals raise as
    the SDK's do."""

    def submit(self, operations: Sequence[Operation], **options: Any) -> list[str] | TransactionFailure: ...

    def insert(self, entity: Mapping[str, Any], **options: Any) -> str | None: ...

    def query(self, query_filter: str, parameters: Mapping[str, str], limit: int) -> Sequence[Any]:
        """The first ``limit`` rows ``query_filter`` matches (``@name``: a text parameter), each
        with ``metadata`` (etag, timestamp)."""
        ...

    def sibling(self, table: TableClient) -> Transactions:
        """The same transport, writing to ``table`` (another table of the account)."""
        ...


class SdkTransactions:
    """``Transactions`` through the SDK's client of the table."""

    def __init__(self, table: TableClient) -> None:
        self._table = table

    def submit(self, operations: Sequence[Operation], **options: Any) -> list[str] | TransactionFailure:
        tuples = [("create", op) if isinstance(op, Mapping) else op for op in operations]  # bare entities: inserts
        if len(tuples) == 1 and operation_kind(tuples[0][0]) != "delete":
            return self._one(*tuples[0], **options)  # one write: the SDK's call for it, not its multipart
        try:
            answers = self._table.submit_transaction(tuples, **{**resendable(tuples), **options})
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            # The SDK reads a transaction's answer after azure-core's transport: an answer cut
            # short escapes as requests' error. It may have been applied: as the lean path says.
            raise ServiceResponseError(f"the transaction's answer was cut short: {exc}", error=exc) from exc
        except TableTransactionError as exc:
            failure = TransactionFailure.of(exc.status_code or 0, error_code(exc), exc.message or "")
            if not failure.decided_for(tuples):
                raise
            return failure
        return [str(answer.get("etag") or "") for answer in answers]

    def _one(self, kind: Any, entity: Mapping[str, Any], settings: Mapping[str, Any] | None = None,
             **options: Any) -> list[str] | TransactionFailure:  # fmt: skip
        """One insert, upsert or replace as the SDK's single-entity call sends it, its refusal as
        the transaction's would read. (Not a delete: the SDK's delete_entity reads an entity
        already gone as success, where a transaction says so.)"""
        kind, settings = operation_kind(kind), {**(settings or {}), **options}
        try:
            if kind == "create":
                meta = self._table.create_entity(dict(entity), **settings)
            elif kind == "upsert":
                meta = self._table.upsert_entity(dict(entity), **settings)
            elif kind == "update":
                meta = self._table.update_entity(dict(entity), **settings)
            else:
                raise ValueError(f"Unrecognized operation: {kind}")
        except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError) as exc:
            failure = TransactionFailure(0, exc.status_code or 0, error_code(exc), exc.message or "")
            if not failure.decided_for([(kind, entity)]):
                raise
            return failure
        return [str(meta.get("etag") or "")]

    def query(self, query_filter: str, parameters: Mapping[str, str], limit: int) -> list[TableEntity]:
        found = self._table.query_entities(query_filter, parameters=dict(parameters), results_per_page=min(limit, 1000))
        return list(islice(found, limit))

    def sibling(self, table: TableClient) -> SdkTransactions:
        return SdkTransactions(table)

    def insert(self, entity: Mapping[str, Any], **options: Any) -> str | None:
        try:
            meta = self._table.create_entity(dict(entity), **options)
        except ResourceExistsError:
            return None
        return str(meta.get("etag") or "")
