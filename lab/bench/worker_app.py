"""The function app that lab/bench/worker.py runs in the real Azure Functions Python worker (it
is copied into a folder of its own as ``function_app.py``, beside the deployed ``shared`` and
``consumers``):

- ``dedup``: a Service Bus function built as the template's consumers are (consumers/orders.py):
  a ``@consumer`` on ``shared_store()`` (the store the app settings configure: DEDUP_STORE,
  DEDUP_STORAGE_CONNECTION, DEDUP_TABLE, DEDUP_TABLE_TRANSACTIONS), the orders handler and
  schema, one ``on_servicebus`` call;
- ``plain``: the same business transaction without dedup, lab/bench/__main__.py's
  ``baseline(lean=True)``: parse, validate with the same schema, the same handler's entities
  (order + ledger posting) in one entity-group transaction on the lean path, with the store's
  own client and transport settings, to BENCH_PLAIN_TABLE; no key, fingerprint or marker;
- ``bench_requests`` (HTTP): how many requests the store clients of both have sent so far
  (the ``dedup.store.requests`` counter, read from an in-memory OpenTelemetry reader when
  BENCH_COUNT_STORE_REQUESTS=1; null otherwise).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

import azure.functions as func
from jsonschema import Draft202012Validator
from opentelemetry import metrics

from consumers.orders import SCHEMA, order_handler
from shared.idempotency import Effects, IdempotentConsumer
from shared.idempotency.functions import BODY_AS_BYTES, check_app_settings, consumer, on_servicebus, shared_store
from shared.idempotency.keys import encode_key
from shared.idempotency.payload import parse_json
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import TRANSPORT, table_service
from shared.idempotency.stores._table_batch import TableTransactions, TransactionFailure

# As function_app.py: the SDKs' per-request HTTP logging stays out of the app's logs.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
READER: Any = None
if os.environ.get("BENCH_COUNT_STORE_REQUESTS") == "1":  # before any request is counted
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    READER = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))

if "azure_functions_worker" in sys.modules:  # as function_app.py: bad settings fail the start
    check_app_settings()
app = func.FunctionApp()


@consumer
def orders() -> IdempotentConsumer:
    return IdempotentConsumer("orders", shared_store(), order_handler(), schema=SCHEMA)


@app.function_name("dedup")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="bench-dedup", connection="ServiceBusConnection",
                               data_type=BODY_AS_BYTES)  # fmt: skip
def dedup(msg: func.ServiceBusMessage) -> None:
    on_servicebus(orders, msg)


VALIDATOR = Draft202012Validator(SCHEMA)
HANDLER = order_handler(key_is_order_id=False)
_transactions: list[TableTransactions] = []
_lock = threading.Lock()


def transactions() -> TableTransactions:
    """Built once, on first use, as the app's store is: its service client and TRANSPORT."""
    if not _transactions:
        with _lock:
            if not _transactions:
                table = os.environ["BENCH_PLAIN_TABLE"]
                _transactions.append(TableTransactions.of(table_service(), table, **TRANSPORT))
    return _transactions[0]


@app.function_name("plain")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="bench-plain", connection="ServiceBusConnection",
                               data_type=BODY_AS_BYTES)  # fmt: skip
def plain(msg: func.ServiceBusMessage) -> None:
    order = parse_json(msg.get_body())
    VALIDATOR.validate(order)
    effects = HANDLER(order, None)  # type: ignore[arg-type]  # needs no context without steps
    assert isinstance(effects, Effects)
    pk = encode_key(order["orderId"])
    answer = transactions().submit([TableStore.effect_entity(pk, e) for e in effects.entities])
    if isinstance(answer, TransactionFailure):
        raise RuntimeError(f"the transaction was refused: {answer}")


@app.function_name("bench_requests")
@app.route(route="lab/bench/requests", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def bench_requests(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(json.dumps({"store_requests": store_requests()}), mimetype="application/json")


def store_requests() -> int | None:
    if READER is None:
        return None
    total = 0
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "dedup.store.requests":
                    total += sum(int(point.value) for point in metric.data.data_points)
    return total
