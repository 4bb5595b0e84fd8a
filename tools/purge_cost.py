"""Cost of purging expired markers from Table Storage, measured on Azurite:
`python -m tools.purge_cost [orders]`. Seeds orders (half expired), then purges, and
reports requests and time per deleted marker and per scanned entity, as ratios to the
seeding rate measured in the same run (this machine is shared and noisy)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

from azure.data.tables import TableServiceClient

from shared.idempotency import DedupKey, Entity
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import TRANSPORT
from tools.azurite import Azurite


def measure(orders: int) -> dict[str, float]:
    with Azurite() as azurite:
        store = TableStore(TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT), "purge")
        store.create_tables()
        now = utcnow()
        started = time.perf_counter()
        for i in range(orders):
            key = DedupKey("orders", f"o-{i}")
            expires = now - timedelta(days=1) if i % 2 == 0 else now + timedelta(days=1)
            effects = [Entity("order", {"orderId": key.id}), Entity("charge|1", {"orderId": key.id})]
            store.commit(key, key.id, "fp", effects, None, expires)
        seed_seconds = time.perf_counter() - started
        started = time.perf_counter()
        purge = store.purge_expired(utcnow(), budget=orders * 2)
        purge_seconds = time.perf_counter() - started
    entities = orders * 4  # guard, marker, order, charge
    return {
        "orders": orders,
        "entities_scanned_by_the_server": entities,
        "matched": purge.scanned,
        "deleted": purge.deleted,
        "requests": purge.requests,
        "requests_per_deleted_marker": round(purge.requests / (purge.deleted / 2), 3),
        "purge_ms_per_deleted_marker": round(purge_seconds * 1000 / (purge.deleted / 2), 3),
        "seed_ms_per_order": round(seed_seconds * 1000 / orders, 3),
        "purge_to_commit_time_ratio": round((purge_seconds / (purge.deleted / 2)) / (seed_seconds / orders), 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("orders", type=int, nargs="?", default=4000, help="orders to seed (half expired)")
    print(json.dumps(measure(parser.parse_args().orders), indent=1))
