"""The store contract (shared.idempotency.testing) run against each shipped store's real
server: Table Storage on Azurite; Cosmos DB on the local emulator (tests needing atomic
batches skip there) or on real Cosmos DB when COSMOS_CONTRACT_ENDPOINT / COSMOS_CONTRACT_KEY
are set."""

from __future__ import annotations

import pytest
from azure.cosmos import PartitionKey
from azure.data.tables import TableServiceClient

from lab.cosmos_emulator import CosmosEmulator, emulated
from shared.idempotency.stores import CosmosStore, DedupStore, TableStore
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.testing import StoreContract
from shared.idempotency.testing.azurite import Azurite
from tests.conftest import EMULATED, NO_ATOMIC_BATCHES, new_cosmos_store, new_table_store


class TestTableStore(StoreContract):
    @pytest.fixture
    def store(self, azurite: Azurite) -> DedupStore:
        return new_table_store(azurite)

    def unreachable_store(self) -> DedupStore:
        down = Azurite()  # never started: nothing listens on its port
        service = TableServiceClient.from_connection_string(down.connection_string, retry_total=0)
        return TableStore(service, table="unreachable")


class TestTableStoreLean(TestTableStore):
    """The same contract with commits through the lean transaction path (stores/_table_batch.py)."""

    @pytest.fixture
    def store(self, azurite: Azurite) -> DedupStore:
        return new_table_store(azurite, lean=True)

    def unreachable_store(self) -> DedupStore:
        down = Azurite()
        service = TableServiceClient.from_connection_string(down.connection_string, retry_total=0)
        lean = TableTransactions.of(service, "unreachable", retry_total=0)
        return TableStore(service, "unreachable", transactions=lean)


class TestCosmosStore(StoreContract):
    no_atomic_batches = NO_ATOMIC_BATCHES

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest) -> DedupStore:
        return new_cosmos_store(request)

    def atomic_batches(self, store: DedupStore) -> bool:
        return id(store) not in EMULATED

    def expires_natively(self, store: DedupStore) -> bool:
        return True

    def unreachable_store(self) -> DedupStore:
        with CosmosEmulator() as emulator:  # a server of its own, stopped once the store is built
            database = emulator.client().create_database_if_not_exists("down")
            container = database.create_container("c", partition_key=PartitionKey("/partitionKey"))
            dead = database.create_container("d", partition_key=PartitionKey("/scope"))
            store = CosmosStore(emulated(container), emulated(dead), "partitionKey")
        return store

    def assert_dead_letters_expire(self, store: DedupStore, scope: str) -> None:
        assert isinstance(store, CosmosStore)
        (item,) = store.dead_letter_container.query_items(
            "SELECT * FROM c WHERE c.scope = @s", parameters=[{"name": "@s", "value": scope}], partition_key=scope
        )
        assert item["ttl"] == 600  # Cosmos DB deletes it (the local emulator does not enforce ttl)
