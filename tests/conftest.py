from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency.settings import TRANSPORT
from shared.idempotency.table_store import TableStore
from tools.azurite import Azurite


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """The real Azurite Table service, on a free port, for the whole test run."""
    with Azurite() as emulator:
        yield emulator


def new_table_store(azurite: Azurite) -> TableStore:
    name = "t" + uuid.uuid4().hex[:16]
    service = TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT)
    store = TableStore(service, table=name, dead_letter_table=name + "dl")
    store.create_tables()
    return store


@pytest.fixture
def table_store(azurite: Azurite) -> TableStore:
    """A store on fresh tables, so tests never see each other's data."""
    return new_table_store(azurite)
