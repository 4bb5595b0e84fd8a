"""The fixtures every suite shares. The servers (Azurite, the Cosmos DB emulator) and the
store SDKs are imported by the fixtures and builders that use them, never at import: the
unit tests load neither."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from shared.idempotency.testing import reset

if TYPE_CHECKING:
    from azure.data.tables import TableServiceClient

    from lab.cosmos_emulator import CosmosEmulator
    from shared.idempotency.stores import CosmosStore, DedupStore, TableStore
    from shared.idempotency.testing.azurite import Azurite


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in the long lane says why (``pytest.mark.long("reason")``): no test leaves
    ``make test`` unexplained."""
    for item in items:
        for mark in item.iter_markers("long"):
            if len(mark.args) != 1 or not isinstance(mark.args[0], str) or not mark.args[0].strip():
                raise pytest.UsageError(f'{item.nodeid}: pytest.mark.long("why") names its reason')


@pytest.fixture(autouse=True)
def _restore_app_settings() -> Iterator[None]:
    """Harness runs point the app's settings at their own servers and payment API: put
    them back, so that no test inherits another's (e.g. a stopped payment API)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
        reset()


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """The real Azurite Table service, on a free port, for the whole test run."""
    from shared.idempotency.testing.azurite import Azurite

    with Azurite() as emulator:
        yield emulator


def new_table_store(azurite: Azurite, *, lean: bool = False, hook: Callable[[Any], None] | None = None,
                    wire: Callable[[Any], Any] | None = None) -> TableStore:  # fmt: skip
    """``lean``: commits through table_batch.TableTransactions, else the SDK's; ``hook``: sees
    every request of both paths (to count them); ``wire``: wraps the transport the store's
    transactions go through (a ``shared.idempotency.testing.faults.PassThrough``, to lose an answer)."""
    from azure.core.pipeline.transport import RequestsTransport
    from azure.data.tables import TableServiceClient

    from shared.idempotency.stores import TableStore
    from shared.idempotency.stores._azure import TRANSPORT
    from shared.idempotency.stores._table_batch import TableTransactions
    from shared.idempotency.stores._transport import transaction_transport

    name = "t" + uuid.uuid4().hex[:16]
    options = {**TRANSPORT, **({"raw_request_hook": hook} if hook else {})}
    sdk_wire = {"transport": wire(RequestsTransport())} if wire and not lean else {}
    service = TableServiceClient.from_connection_string(azurite.connection_string, **options, **sdk_wire)
    lean_wire = {"transport": wire(transaction_transport())} if wire and lean else {}
    transactions = TableTransactions.of(service, name, **options, **lean_wire) if lean else None
    store = TableStore(service, table=name, dead_letter_table=name + "dl", transactions=transactions)
    store.create_tables()
    return store


CHANGING_STORES = ("memory", "table", "table-lean")  # the stores that commit changes of what a handler read


def changing_store(request: pytest.FixtureRequest, kind: str, *,
                   wire: Callable[[Any], Any] | None = None) -> DedupStore:  # fmt: skip
    """A fresh store of ``kind`` (of CHANGING_STORES); ``wire`` as ``new_table_store`` takes it."""
    from shared.idempotency.stores import MemoryStore

    if kind == "memory":
        return MemoryStore()
    return new_table_store(request.getfixturevalue("azurite"), lean=kind == "table-lean", wire=wire)


@pytest.fixture
def table(azurite: Azurite) -> Iterator[tuple[TableServiceClient, str]]:
    """A fresh, empty table (no store around it) and the client that made it; dropped after."""
    from azure.data.tables import TableServiceClient

    name = "t" + uuid.uuid4().hex[:16]
    service = TableServiceClient.from_connection_string(azurite.connection_string, retry_total=0)
    service.create_table(name)
    yield service, name
    service.delete_table(name)


@pytest.fixture
def table_store(azurite: Azurite) -> TableStore:
    """A store on fresh tables, so tests never see each other's data; commits through the SDK."""
    return new_table_store(azurite)


@pytest.fixture
def lean_store(azurite: Azurite) -> TableStore:
    """A store on fresh tables; commits through the lean transaction path."""
    return new_table_store(azurite, lean=True)


@pytest.fixture
def items_store(azurite: Azurite) -> Iterator[TableStore]:
    """The test app (tests/app.py) on fresh tables, and its store: the one its functions and
    consumers use (DEDUP_STORE unset: a Table store, the SDK's path)."""
    from shared.idempotency.functions import shared_store
    from shared.idempotency.stores import TableStore
    from tests.functions import fresh_app

    with fresh_app(azurite):
        store = shared_store()
        assert isinstance(store, TableStore)
        yield store


@pytest.fixture(scope="session")
def cosmos_emulator() -> Iterator[CosmosEmulator]:
    """npm @vercel/cosmosdb-server, on a free port, for the whole test run."""
    from lab.cosmos_emulator import CosmosEmulator

    with CosmosEmulator() as emulator:
        yield emulator


REAL_COSMOS = os.environ.get("COSMOS_CONTRACT_ENDPOINT"), os.environ.get("COSMOS_CONTRACT_KEY")
# Stores whose server lacks atomic transactional batches and TTL (the local emulator).
EMULATED: set[int] = set()


def new_cosmos_store(request: pytest.FixtureRequest) -> CosmosStore:
    """Fresh containers partitioned by /partitionKey: on real Cosmos DB when
    COSMOS_CONTRACT_ENDPOINT/COSMOS_CONTRACT_KEY are set, else on the local emulator."""
    from azure.cosmos import CosmosClient, PartitionKey

    from lab.cosmos_emulator import emulated
    from shared.idempotency.stores import CosmosStore

    endpoint, key = REAL_COSMOS
    if endpoint and key:
        client = CosmosClient(endpoint, credential=key)
    else:
        client = request.getfixturevalue("cosmos_emulator").client()
    database = client.create_database_if_not_exists("contract")
    name = "c" + uuid.uuid4().hex[:16]
    container = database.create_container(name, partition_key=PartitionKey("/partitionKey"), default_ttl=3600)
    dead = database.create_container(name + "dl", partition_key=PartitionKey("/scope"), default_ttl=-1)
    if endpoint and key:
        request.addfinalizer(lambda: (database.delete_container(name), database.delete_container(name + "dl")))
        return CosmosStore(container, dead, "partitionKey")
    store = CosmosStore(emulated(container), emulated(dead), "partitionKey")
    EMULATED.add(id(store))
    return store


@pytest.fixture(params=["table", "cosmos"])
def store(request: pytest.FixtureRequest, azurite: Azurite) -> DedupStore:
    """Every store implementation, each on fresh tables/containers."""
    return new_table_store(azurite) if request.param == "table" else new_cosmos_store(request)


NO_ATOMIC_BATCHES = ("the local Cosmos emulator's transactional batch is not atomic and has no replace: set "
                     "COSMOS_CONTRACT_ENDPOINT and COSMOS_CONTRACT_KEY to run this against Cosmos DB")  # fmt: skip
