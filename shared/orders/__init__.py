"""The example domain: an order creates an order record and charges the customer once.

The ledger is append-only, as ledgers are: each posting is a new entity. Nothing in the
data itself stops a second posting for the same order; the dedup marker committed in
the same transaction is what does — the pattern's reason to exist. When a payment API
is configured, the charge is made there first, as a two-phase step.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from shared.idempotency import Context, Effects, Entity, IdempotentHttp, InvalidMessage, LatestState, Outgoing
from shared.idempotency.consumer import Handler

SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("schema.json")).read_text())

ORDER = "order"
CHARGE_PREFIX = "charge|"


EVENTS_CONSUMER = "order-events"  # the shipment events' consumer, from Event Grid and (recipe) over HTTP


def payments() -> IdempotentHttp | None:
    """The payment API the orders charge through, when PAYMENT_API_URL is set (recipe ``payments``)."""
    url = os.environ.get("PAYMENT_API_URL")
    return IdempotentHttp(url) if url else None


def accepted_topic() -> str | None:
    """Where the orders publish ``OrderAccepted`` (recipe ``outbox``), when ORDER_ACCEPTED_TOPIC is set."""
    return os.environ.get("ORDER_ACCEPTED_TOPIC") or None


def housekeeping() -> set[str]:
    """What the orders consumers need of the store's housekeeping, by the features switched on:
    reconcile_claims for the payment step ("steps"), dispatch_outbox for the outbox ("outbox")."""
    return {name for name, on in (("steps", payments()), ("outbox", accepted_topic())) if on}


def order_handler(payments: IdempotentHttp | None = None, *, key_is_order_id: bool = True,
                  accepted_topic: str | None = None) -> Handler:  # fmt: skip
    """Without ``payments`` the handler does no I/O: one transaction commits the order,
    its ledger posting and the marker. With it, the charge goes through the payment API
    (step ``charge``) and the posting records the payment's charge id. With
    ``accepted_topic``, the order is published there as ``OrderAccepted`` (the outbox:
    committed with the order, sent after it, for billing and shipping).
    ``key_is_order_id``: the queue's producer sets MessageId = orderId, so they must agree
    (an HTTP caller's Idempotency-Key is its own)."""

    def handle(order: dict[str, Any], context: Context) -> Effects:
        if key_is_order_id and order["orderId"] != context.key.id:
            raise InvalidMessage("key_mismatch", "the message's key is not its orderId")
        charge = {
            "orderId": order["orderId"],
            "customerId": order["customerId"],
            "amount": float(order["amount"]),
            "currency": order["currency"],
        }
        posting_id = uuid.uuid4().hex
        if payments is not None:
            accepted = context.step("charge", lambda key: payments.post("/charges", charge, key))
            posting_id = str(accepted["id"])
        return Effects(
            entities=[
                Entity(ORDER, {**charge, "items": order["items"]}),
                Entity(CHARGE_PREFIX + posting_id, charge),
            ],
            result={"orderId": order["orderId"], "charged": charge["amount"], "currency": order["currency"]},
            messages=[Outgoing(accepted_topic, order, "accepted", {"type": "OrderAccepted"})] if accepted_topic else [],
        )

    return handle


SHIPPED = "com.example.order.shipped"  # the CloudEvents type of a shipment
SHIPPED_SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("shipped.schema.json")).read_text())


def shipment_handler(event: dict[str, Any], context: Context) -> Effects:
    """An ``com.example.order.shipped`` CloudEvent records one shipment."""
    shipped = event["data"]
    record = {"orderId": shipped["orderId"], "carrier": shipped["carrier"], "trackingNumber": shipped["trackingNumber"]}
    return Effects(entities=[Entity("shipment", record)], result={"orderId": shipped["orderId"], "shipped": True})


# -- publish-subscribe: two subscribers of the order topic, one store ---------------------


def _same_order(order: dict[str, Any], context: Context) -> None:
    if order["orderId"] != context.key.id:
        raise InvalidMessage("key_mismatch", "the message's key is not its orderId")


def invoice_handler(order: dict[str, Any], context: Context) -> Effects:
    """Billing's own effect of an order: one invoice."""
    _same_order(order, context)
    invoice = {"orderId": order["orderId"], "customerId": order["customerId"], "amount": float(order["amount"]),
               "currency": order["currency"]}  # fmt: skip
    return Effects([Entity("invoice", invoice)], {"invoiced": invoice["amount"]})


def picklist_handler(order: dict[str, Any], context: Context) -> Effects:
    """Shipping's own effect of the same order: one pick list."""
    _same_order(order, context)
    lines = [f"{item['quantity']} x {item['sku']}" for item in order["items"]]
    return Effects([Entity("picklist", {"orderId": order["orderId"], "lines": lines})], {"lines": len(lines)})


# -- event-carried state: naturally idempotent, no marker ---------------------------------

STATUS_SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("status.schema.json")).read_text())


def status_handler(change: dict[str, Any], context: Context) -> LatestState:
    """``OrderStatusChanged {orderId, status, version}`` carries the absolute status: it
    is applied as an upsert when its version is newer, ignored (``stale``) otherwise."""
    state = {"orderId": change["orderId"], "status": change["status"]}
    return LatestState(Entity("status", state), int(change["version"]), {"status": change["status"]})
