"""Returns from a Storage queue (recipe ``queue``): one return record per returnId. The queue
message's id is the service's (a producer's retry enqueues a new one), so the key is the
body's ``returnId``. A failed message is dequeued again, at most host.json's maxDequeueCount
times, then moved to ``<queue>-poison``; its last dequeue records a dead letter with why."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, from_body_field
from shared.idempotency.functions import consumer, on_storage_queue, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["returnId", "orderId", "amount"],
    "properties": {
        "returnId": {"type": "string", "minLength": 1, "maxLength": 200},
        "orderId": {"type": "string", "minLength": 1, "maxLength": 200},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "reason": {"type": "string", "maxLength": 500},
    },
    "additionalProperties": False,
}


def record_return(body: dict[str, Any], context: Context) -> Effects:
    return Effects([Entity("return", body)], result={"returnId": body["returnId"]})


@consumer
def returns_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("returns", shared_store(), record_return, schema=SCHEMA,
                              key_source=from_body_field("returnId"))  # fmt: skip


@bp.function_name("order_returns")
@bp.queue_trigger(arg_name="msg", queue_name="%RETURNS_QUEUE%", connection="StorageQueueConnection")
def order_returns(msg: func.QueueMessage) -> None:
    on_storage_queue(returns_consumer, msg)
