"""Azure plumbing shared by the Table and Cosmos stores: what their SDKs' errors mean
(``store_errors``), the transport settings every store client is built with, and the
clients built from the app settings (connection string locally, managed identity on Azure)."""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import (
    ClientAuthenticationError,
    DecodeError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from .. import telemetry
from ..config import setting
from ..errors import ConfigurationError, StoreRefused, StoreUnavailable

if TYPE_CHECKING:  # each store's SDK is an optional dependency (extras "table", "cosmos")
    from azure.cosmos import ContainerProxy, CosmosClient
    from azure.data.tables import TableServiceClient

log = logging.getLogger("idempotency")


def is_transient(status: int | None) -> bool:
    """Throttling, timeouts and server errors (Cosmos DB's 449 "retry with" included)."""
    return status in (408, 429, 449) or (status or 0) >= 500


# What a store answers about a message's own data (a value, an entity, a request too large;
# the same row twice in one transaction): refused for good. Any other 400 may be a
# deployment's mistake (an API version, a header, an account setting): never dead-letter for it.
REFUSED_FOR_GOOD = frozenset({"PropertyValueTooLarge", "EntityTooLarge", "PropertyNameTooLong", "TooManyProperties",
                              "KeyValueTooLarge", "InvalidDuplicateRow", "RequestBodyTooLarge"})  # fmt: skip
DATA_ROLES = "Table Storage: 'Storage Table Data Contributor'; Cosmos DB: 'Cosmos DB Built-in Data Contributor'"


def error_code(exc: Exception) -> str:
    """The service's error code an azure-core error carries (undeclared; an enum in some SDKs)."""
    code = getattr(exc, "error_code", None) or ""
    return str(getattr(code, "value", code))


class store_errors:  # lower case: used as ``with store_errors():``, as the function it was
    """Map what the SDKs could not get through (after their own retries) to one outcome.
    Both SDKs raise azure-core's errors (Cosmos DB's are subclasses):

    - unreachable, throttled, 5xx → StoreUnavailable: wait, then let the broker redeliver;
    - an answer lost or not read whole (azure-core's DecodeError: IncompleteReadError, a body
      cut short after the status line; the request may have been applied) → StoreUnavailable:
      the redelivery reads the marker back;
    - 401/403 → StoreUnavailable too, logged with the role the app's identity most likely
      lacks: a missing role assignment is fixed by an operator, not by dead-lettering;
    - 413 (the Table SDK's RequestTooLargeError too, which says 202 for a changeset's 413), or
      a 400 whose code says the data is too large (REFUSED_FOR_GOOD) → StoreRefused: this
      message's data can never be stored; dead-letter it;
    - any other 400 → StoreUnavailable, logged: likely the deployment's, not the message's;
    - with ``table`` named, a table that does not exist (404 TableNotFound; and, for ``writes``,
      Cosmos DB's Table API's 404 ResourceNotFound, which a write raises only for a missing
      table) → ConfigurationError naming it: the deployment's, never a message's decision;
    - anything else (404 on a read, 409, 412) passes through: the callers read those.

    A class rather than a generator-based context manager: it wraps every store request,
    and costs a fifth as much."""

    __slots__ = ("_table", "_writes")

    def __init__(self, table: str | None = None, *, writes: bool = False) -> None:
        self._table, self._writes = table, writes

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None) -> None:
        if isinstance(exc, ServiceRequestError | ServiceResponseError | DecodeError):
            raise StoreUnavailable(str(exc)) from exc
        if not isinstance(exc, HttpResponseError):
            return
        code = error_code(exc)
        missing = code == "TableNotFound" or (self._writes and code == "ResourceNotFound")
        if self._table is not None and exc.status_code == 404 and missing:
            raise ConfigurationError(f"table {self._table!r} does not exist (the service answered 404 {code}): "
                                     "check the app settings, or deploy it") from exc  # fmt: skip
        if is_transient(exc.status_code):
            raise StoreUnavailable(f"{exc.status_code} {code}: {exc.message}") from exc
        if isinstance(exc, ClientAuthenticationError) or exc.status_code in (401, 403):
            log.error("dedup store refused access (%s %s): grant the app's identity a data role (%s)",
                      exc.status_code, code, DATA_ROLES)  # fmt: skip
            raise StoreUnavailable(f"{exc.status_code} {code}: access refused ({DATA_ROLES})") from exc
        too_large = exc.status_code == 413 or (exc.status_code == 202 and _too_large(exc))  # 202: see _too_large
        if too_large or (exc.status_code == 400 and code in REFUSED_FOR_GOOD):
            raise StoreRefused(f"{413 if too_large else 400} {code}: {exc.message}"[:500]) from exc
        if exc.status_code == 400:
            log.error("dedup store answered 400 %s, not about a message's data: check the deployment", code)
            raise StoreUnavailable(f"400 {code}: {exc.message}"[:500]) from exc


def _too_large(exc: HttpResponseError) -> bool:
    """The Table SDK's RequestTooLargeError, which carries the status of the 202 around a
    changeset's 413 (imported here: that SDK is an optional extra)."""
    try:
        from azure.data.tables import RequestTooLargeError
    except ImportError:
        return False
    return isinstance(exc, RequestTooLargeError)


# Fail fast so that the broker, not the SDK, does the long waiting: a failed call is
# retried a few times, then the message is abandoned and redelivered later.
TRANSPORT: dict[str, Any] = {
    "raw_request_hook": telemetry.count_store_request,
    "retry_total": 3,
    "retry_backoff_factor": 0.4,
    "retry_backoff_max": 4,
    "connection_timeout": 5,
    "read_timeout": 10,  # a store request is small: a stalled answer is retried, not waited on
}


def table_service() -> TableServiceClient:
    """DEDUP_STORAGE_CONNECTION (a connection string: Azurite locally) or
    DEDUP_STORAGE_ENDPOINT (https://<account>.table.core.windows.net, managed identity)."""
    from azure.data.tables import TableServiceClient

    from ._table_batch import check_changeset
    from ._transport import pooled_transport

    timeouts = {name: TRANSPORT[name] for name in ("connection_timeout", "read_timeout")}
    # More connections than concurrent calls; a transaction's answer checked as the lean path checks it.
    options = {**TRANSPORT, "transport": pooled_transport(**timeouts), "raw_response_hook": check_changeset}
    connection, endpoint = table_account()
    if connection:
        return TableServiceClient.from_connection_string(connection, **options)
    from azure.identity import DefaultAzureCredential

    return TableServiceClient(endpoint, credential=DefaultAzureCredential(), **options)


def table_account() -> tuple[str, str]:
    """(DEDUP_STORAGE_CONNECTION, DEDUP_STORAGE_ENDPOINT), one of them set; else ConfigurationError."""
    connection, endpoint = os.environ.get("DEDUP_STORAGE_CONNECTION", ""), os.environ.get("DEDUP_STORAGE_ENDPOINT", "")
    if not connection and not endpoint:
        raise ConfigurationError("set DEDUP_STORAGE_CONNECTION (local) or DEDUP_STORAGE_ENDPOINT (managed identity)")
    return connection, endpoint


def table_transactions() -> str:
    """DEDUP_TABLE_TRANSACTIONS: ``lean`` (default) builds and reads each commit's entity-group
    transaction itself (stores/_table_batch.py); ``sdk`` uses the Azure SDK's submit_transaction."""
    value = setting("DEDUP_TABLE_TRANSACTIONS", "lean").lower()
    if value not in ("lean", "sdk"):
        raise ConfigurationError(f"DEDUP_TABLE_TRANSACTIONS={value!r}: use 'lean' or 'sdk'")
    return value


def cosmos_client() -> CosmosClient:
    """COSMOS_ENDPOINT with managed identity; COSMOS_KEY only for local emulators."""
    from azure.cosmos import CosmosClient

    endpoint = setting("COSMOS_ENDPOINT")
    key = os.environ.get("COSMOS_KEY")
    hook = telemetry.count_store_request
    if key:  # a local emulator: plain HTTP, a single region
        return CosmosClient(endpoint, credential=key, enable_endpoint_discovery=False, raw_request_hook=hook)
    from azure.identity import DefaultAzureCredential

    return CosmosClient(endpoint, credential=DefaultAzureCredential(), raw_request_hook=hook)


def partition_field(container: ContainerProxy) -> str:
    """The property named by the container's partition key path (``/partitionKey``).

    :raises ConfigurationError: the container does not exist (named), or its path is nested."""
    from azure.cosmos.exceptions import CosmosResourceNotFoundError

    try:
        path = container.read()["partitionKey"]["paths"][0]
    except CosmosResourceNotFoundError:
        raise ConfigurationError(f"container {container.id!r} does not exist: check the app settings "
                                 "(COSMOS_DATABASE, COSMOS_CONTAINER), or deploy it") from None  # fmt: skip
    if path.count("/") != 1:
        raise ConfigurationError(f"partition key path {path!r}: use a top-level property such as /partitionKey")
    return str(path.lstrip("/"))
