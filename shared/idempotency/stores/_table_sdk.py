"""The Table store's writes through the Azure SDK (``TableClient.submit_transaction`` and
``create_entity``): the default transport. ``_table_batch.TableTransactions`` is the lean one,
the same two calls in fewer instructions; the store is given one at construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import requests
import urllib3
from azure.core.exceptions import ResourceExistsError, ServiceResponseError
from azure.data.tables import TableClient, TableTransactionError

from ._azure import error_code
from ._table_batch import Operation, TransactionFailure


class Transactions(Protocol):
    """How a Table store writes: ``submit`` one entity-group transaction (each operation's
    new ETag, or the refusal the caller decides on); ``insert`` one entity (its ETag, None
    when it already existed). Other refusals raise as the SDK's do."""

    def submit(self, operations: Sequence[Operation], **options: Any) -> list[str] | TransactionFailure: ...

    def insert(self, entity: Mapping[str, Any], **options: Any) -> str | None: ...

    def sibling(self, table: TableClient) -> Transactions:
        """The same transport, writing to ``table`` (another table of the account)."""
        ...


class SdkTransactions:
    """``Transactions`` through the SDK's client of the table."""

    def __init__(self, table: TableClient) -> None:
        self._table = table

    def submit(self, operations: Sequence[Operation], **options: Any) -> list[str] | TransactionFailure:
        tuples = [("create", op) if isinstance(op, Mapping) else op for op in operations]  # bare entities: inserts
        try:
            answers = self._table.submit_transaction(tuples, **options)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            # The SDK reads a transaction's answer after azure-core's transport: an answer cut
            # short escapes as requests' error. It may have been applied: as the lean path says.
            raise ServiceResponseError(f"the transaction's answer was cut short: {exc}", error=exc) from exc
        except TableTransactionError as exc:
            failure = TransactionFailure.of(exc.status_code or 0, error_code(exc), exc.message or "")
            if not failure.decided:
                raise
            return failure
        return [str(answer.get("etag") or "") for answer in answers]

    def sibling(self, table: TableClient) -> SdkTransactions:
        return SdkTransactions(table)

    def insert(self, entity: Mapping[str, Any], **options: Any) -> str | None:
        try:
            meta = self._table.create_entity(dict(entity), **options)
        except ResourceExistsError:
            return None
        return str(meta.get("etag") or "")
