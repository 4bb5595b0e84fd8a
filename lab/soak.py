"""Memory over a long run: `python -m lab.soak [messages]` (default 100,000) sends orders
through one consumer process (the `orders` consumer on Azurite, lean path, 16 concurrent
calls, a third of them duplicates) and prints the process's RSS every tenth of the run.
Bounded memory: the completed-keys cache, the connection pools and the telemetry reach a
plateau; the run fails if the last tenth grew RSS by more than 10% over the second."""

from __future__ import annotations

import argparse
import json
import resource
import sys
from concurrent.futures import ThreadPoolExecutor

from azure.data.tables import TableServiceClient

from consumers.orders import SCHEMA, order_handler
from shared.idempotency import DedupConfig, Delivery, IdempotentConsumer
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import TRANSPORT
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.testing.azurite import Azurite


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("messages", nargs="?", type=int, default=100_000)
    total = parser.parse_args(argv).messages
    step = max(1, total // 10)
    samples: list[tuple[int, float]] = []
    with Azurite() as azurite, ThreadPoolExecutor(16) as pool:
        service = TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT)
        store = TableStore(service, "soak", "soakdl", transactions=TableTransactions.of(service, "soak", **TRANSPORT))
        store.create_tables()
        consumer = IdempotentConsumer("soak", store, order_handler(), schema=SCHEMA, config=DedupConfig())

        def deliver(i: int) -> None:
            n = i - i % 3 if i % 3 == 2 else i  # every third message repeats an earlier one
            body = json.dumps({"orderId": f"o-{n}", "customerId": "c", "amount": 1.0, "currency": "EUR",
                               "items": [{"sku": "a", "quantity": 1}]}).encode()  # fmt: skip
            result = consumer.process(Delivery(body, message_id=f"o-{n}", delivery_count=1))
            assert result.acknowledge, result

        for start in range(0, total, step):
            list(pool.map(deliver, range(start, min(total, start + step))))
            samples.append((min(total, start + step), rss_mb()))
            print(json.dumps({"messages": samples[-1][0], "rss_mb": round(samples[-1][1], 1)}), flush=True)
    grew = samples[-1][1] / samples[1][1] - 1 if len(samples) > 1 else 0.0
    print(json.dumps({"messages": total, "rss_growth_after_the_first_tenth": round(grew, 3)}))
    return 0 if grew <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
