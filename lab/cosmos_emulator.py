"""Start and stop npm ``@vercel/cosmosdb-server`` (a Cosmos DB REST API server for tests)
on a free port, and adapt the one behaviour that differs from Cosmos DB in a way our
store depends on: reading a missing item answers 500 there instead of 404.

Known gaps, so tests that need them run only against real Cosmos DB: transactional
batches are not atomic, TTL is not enforced."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from azure.cosmos import ContainerProxy, CosmosClient, PartitionKey, exceptions

from shared.idempotency.testing.azurite import free_port, start_listening

# The well-known key of Microsoft's Cosmos DB emulator (public; the server accepts any).
EMULATOR_KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="


class CosmosEmulator:
    def __init__(self) -> None:
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def client(self) -> CosmosClient:
        return CosmosClient(self.endpoint, credential=EMULATOR_KEY, enable_endpoint_discovery=False)

    def start(self, timeout: float = 30.0) -> CosmosEmulator:
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--no-ssl"]
        self._process = start_listening("cosmosdb-server", args, self.port, timeout)
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
        self._process = None

    def __enter__(self) -> CosmosEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmulatedContainer(ContainerProxy):
    """A ContainerProxy adapted to two emulator bugs, everything else being the SDK's own
    code: ``read_item`` of a missing item answers 404 (the emulator: 500), and a query
    scoped to one partition runs cross-partition and is filtered here (the emulator
    refuses partition-scoped queries with "missing partition keys")."""

    def read_item(self, item: Any, partition_key: Any, *args: Any, **kwargs: Any) -> Any:
        parameters: list[dict[str, Any]] = [{"name": "@id", "value": item}]
        found = list(self.query_items("SELECT * FROM c WHERE c.id = @id", parameters=parameters,
                                      partition_key=partition_key))  # fmt: skip
        if not found:
            raise exceptions.CosmosResourceNotFoundError(status_code=404, message=f"{item} not found")  # type: ignore[no-untyped-call]
        return found[0]

    def query_items(self, query: Any, *args: Any, partition_key: Any = None, **kwargs: Any) -> Any:
        if partition_key is None:
            return super().query_items(query, *args, **kwargs)
        field = self.read()["partitionKey"]["paths"][0].lstrip("/")
        kwargs["enable_cross_partition_query"] = True
        return [item for item in super().query_items(query, *args, **kwargs) if item.get(field) == partition_key]


def emulated(container: ContainerProxy) -> EmulatedContainer:
    proxy = EmulatedContainer.__new__(EmulatedContainer)
    proxy.__dict__.update(container.__dict__)
    return proxy


def use_cosmos_emulator(emulator: CosmosEmulator, container: str) -> None:
    """Provision what infra provisions on Azure, and point the app at it."""
    database = emulator.client().create_database_if_not_exists("dedup")
    database.create_container_if_not_exists(container, PartitionKey("/partitionKey"), default_ttl=30 * 24 * 3600)
    database.create_container_if_not_exists(container + "dl", PartitionKey("/scope"), default_ttl=-1)
    os.environ.update(
        DEDUP_STORE="cosmos",
        COSMOS_ENDPOINT=emulator.endpoint,
        COSMOS_KEY=EMULATOR_KEY,
        COSMOS_DATABASE="dedup",
        COSMOS_CONTAINER=container,
        COSMOS_DEADLETTER_CONTAINER=container + "dl",
    )
