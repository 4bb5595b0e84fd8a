"""Configuration from app settings, with the names and defaults the README documents."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import isodate

from . import telemetry
from .errors import ConfigurationError
from .steps import DEFAULT_STEPS, StepPolicy
from .stores import _base as store_defaults
from .stores._base import DedupStore, store_errors

if TYPE_CHECKING:  # each store's SDK is an optional dependency (extras "table", "cosmos")
    from azure.cosmos import ContainerProxy, CosmosClient
    from azure.data.tables import TableServiceClient

DEFAULT_RETENTION = "P30D"
DEFAULT_DEAD_LETTER_RETENTION = isodate.duration_isoformat(store_defaults.DEFAULT_DEAD_LETTER_RETENTION)  # P14D
DEFAULT_LEASE = isodate.duration_isoformat(DEFAULT_STEPS.lease)  # PT1M
DEFAULT_IN_FLIGHT_WAIT = isodate.duration_isoformat(DEFAULT_STEPS.in_flight_wait)  # PT10S
DEFAULT_TRANSIENT_WAIT = "PT2M"
DEFAULT_MAX_DELIVERY_COUNT = "10"  # Service Bus's default maxDeliveryCount, and infra's


def setting(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None or value == "":
        raise ConfigurationError(f"app setting {name} is required")
    return value


def duration(name: str, default: str) -> timedelta:
    """An ISO-8601 duration setting (days, hours, minutes, seconds)."""
    text = setting(name, default)
    try:
        value = isodate.parse_duration(text)
    except isodate.ISO8601Error as exc:
        raise ConfigurationError(f"{name}={text!r} is not an ISO-8601 duration") from exc
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise ConfigurationError(f"{name}={text!r} must be a non-negative duration in days or less")
    return value


def retention() -> timedelta:
    """DEDUP_RETENTION: how long markers outlive their message."""
    value = duration("DEDUP_RETENTION", DEFAULT_RETENTION)
    if value <= timedelta(0):
        raise ConfigurationError("DEDUP_RETENTION must be positive")
    return value


def dead_letter_retention() -> timedelta:
    """DEDUP_DEAD_LETTER_RETENTION: how long a refused message's record (with its body) is kept."""
    value = duration("DEDUP_DEAD_LETTER_RETENTION", DEFAULT_DEAD_LETTER_RETENTION)
    if value <= timedelta(0):
        raise ConfigurationError("DEDUP_DEAD_LETTER_RETENTION must be positive")
    return value


@dataclass(frozen=True)
class DedupConfig:
    """Every consumer option that the app settings set. ``IdempotentConsumer`` reads it
    from the settings unless given one, so a consumer built in a few lines gets the
    deployed retention, lease, waits and cache."""

    retention: timedelta = timedelta(days=30)
    steps: StepPolicy = DEFAULT_STEPS
    cache_size: int = 10_000
    # How long a delivery waits inside its invocation for a transient failure to clear
    # (Service Bus redelivers an abandoned message at once: without it, an outage spends
    # the whole delivery budget in milliseconds). Triggers with their own delayed retries
    # (Event Grid, HTTP callers) set a shorter wait per delivery.
    transient_wait: timedelta = timedelta(minutes=2)
    # The broker's maxDeliveryCount: the last delivery leaves a dead-letter record of why.
    max_deliveries: int = 10

    @classmethod
    def from_settings(cls) -> DedupConfig:
        """DEDUP_RETENTION, DEDUP_LEASE, DEDUP_IN_FLIGHT_WAIT, DEDUP_CACHE_SIZE,
        DEDUP_TRANSIENT_WAIT, DEDUP_MAX_DELIVERY_COUNT (README, Configuration)."""
        return cls(retention(), step_policy(), whole("DEDUP_CACHE_SIZE", "10000"),
                   duration("DEDUP_TRANSIENT_WAIT", DEFAULT_TRANSIENT_WAIT),
                   max(1, whole("DEDUP_MAX_DELIVERY_COUNT", DEFAULT_MAX_DELIVERY_COUNT)))  # fmt: skip


def whole(name: str, default: str) -> int:
    value = setting(name, default)
    if not value.isdigit():
        raise ConfigurationError(f"{name}={value!r} must be a whole number")
    return int(value)


def step_policy() -> StepPolicy:
    """DEDUP_LEASE (default 1 min) and DEDUP_IN_FLIGHT_WAIT (default 10 s)."""
    return StepPolicy(
        lease=duration("DEDUP_LEASE", DEFAULT_LEASE),
        in_flight_wait=duration("DEDUP_IN_FLIGHT_WAIT", DEFAULT_IN_FLIGHT_WAIT),
    )


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

    from .stores._transport import pooled_transport

    timeouts = {name: TRANSPORT[name] for name in ("connection_timeout", "read_timeout")}
    options = {**TRANSPORT, "transport": pooled_transport(**timeouts)}  # more connections than concurrent calls
    connection = os.environ.get("DEDUP_STORAGE_CONNECTION")
    if connection:
        return TableServiceClient.from_connection_string(connection, **options)
    endpoint = os.environ.get("DEDUP_STORAGE_ENDPOINT")
    if endpoint:
        from azure.identity import DefaultAzureCredential

        return TableServiceClient(endpoint, credential=DefaultAzureCredential(), **options)
    raise ConfigurationError("set DEDUP_STORAGE_CONNECTION (local) or DEDUP_STORAGE_ENDPOINT (managed identity)")


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


def open_store(table: str, dead_letter_table: str, *, create: bool = True) -> DedupStore:
    """DEDUP_STORE=table (default): Table Storage, tables created if missing.
    DEDUP_STORE=cosmos: the COSMOS_CONTAINER container (default ``table``) of
    COSMOS_DATABASE, provisioned by infra (data-plane roles cannot create containers).
    ``create=False`` for read-only tools (a reader role cannot create tables)."""
    kind = setting("DEDUP_STORE", "table").lower()
    keep = dead_letter_retention()
    if kind == "table":
        from .stores._table import TableStore
        from .stores._table_batch import TableTransactions

        service = table_service()
        lean = table_transactions() == "lean"
        transactions = TableTransactions.of(service, table, **TRANSPORT) if lean else None
        store = TableStore(service, table, dead_letter_table, dead_letter_retention=keep, transactions=transactions)
        if create:
            store.create_tables()
        return store
    if kind == "cosmos":
        from .stores._cosmos import CosmosStore

        with store_errors():  # the client and the partition key read go to the service: unreachable is transient
            database = cosmos_client().get_database_client(setting("COSMOS_DATABASE", "dedup"))
            container = database.get_container_client(setting("COSMOS_CONTAINER", table))
            dead_letters = database.get_container_client(setting("COSMOS_DEADLETTER_CONTAINER", dead_letter_table))
            return CosmosStore(container, dead_letters, partition_field(container), dead_letter_retention=keep)
    raise ConfigurationError(f"DEDUP_STORE={kind!r}: use 'table' or 'cosmos'")


def partition_field(container: ContainerProxy) -> str:
    """The property named by the container's partition key path (``/partitionKey``)."""
    path = container.read()["partitionKey"]["paths"][0]
    if path.count("/") != 1:
        raise ConfigurationError(f"partition key path {path!r}: use a top-level property such as /partitionKey")
    return str(path.lstrip("/"))


def app_store(*, create: bool = True) -> DedupStore:
    """The app's store: DEDUP_TABLE (or COSMOS_CONTAINER) and DEDUP_DEADLETTER_TABLE."""
    return open_store(setting("DEDUP_TABLE", "records"), setting("DEDUP_DEADLETTER_TABLE", "deadletters"),
                      create=create)  # fmt: skip
