"""The demo's second part: the same dedup module behind Event Grid (CloudEvents) — and, when
their recipes are switched on, the CloudEvents HTTP endpoint (``cloudevents-http``) and POST
/api/orders with an Idempotency-Key (``http``). What is off is said, not driven."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass

import consumers
from consumers import orders as orders_app
from consumers.order_events import SHIPPED
from lab.runtimes import Runtime


@dataclass
class TriggerReport:
    events: int = 0
    event_deliveries: int = 0
    shipments: int = 0
    requests: int = 0
    orders: int = 0
    api_orders: int = 0
    statuses: Counter[str] | None = None
    events_over_http: bool = False
    orders_api: bool = False

    @property
    def ok(self) -> bool:
        return self.shipments == self.events and self.api_orders == self.orders

    def summary(self) -> str:
        statuses = ", ".join(f"{k} x{v}" for k, v in sorted((self.statuses or Counter()).items()))
        channels = "Event Grid + CloudEvents over HTTP" if self.events_over_http else "Event Grid"
        api = (f"POST /api/orders: {self.orders} orders in {self.requests} requests -> {self.api_orders} orders "
               f"written ({statuses})." if self.orders_api else
               "POST /api/orders: off (make recipe NAME=http switches it on).")  # fmt: skip
        delivered = f"{self.events} events in {self.event_deliveries} deliveries -> {self.shipments} shipments"
        return f"{channels}: {delivered}.\n{api}"


def switched_on() -> set[str]:
    """The modules of consumers/ (a recipe's once switched on)."""
    return {module.__name__.rsplit(".", 1)[1] for module in consumers.modules()}


def drive(runtime: Runtime, events: int = 150, orders: int = 150, seed: int = 7) -> TriggerReport:
    rng = random.Random(seed)
    on = switched_on()
    report = TriggerReport(events=events, statuses=Counter(), events_over_http="events_api" in on,
                           orders_api="orders_api" in on)  # fmt: skip
    report.orders = orders if report.orders_api else 0
    for i in range(events):
        data = {"orderId": f"o-{i}", "carrier": "DHL", "trackingNumber": f"T-{seed}-{i}"}
        over_http = report.events_over_http and i % 2 == 1  # a publisher posts its own; Event Grid delivers others
        for _ in range(rng.randint(1, 3)):  # retries on the same channel
            report.event_deliveries += 1
            if over_http:
                headers = {"ce-specversion": "1.0", "ce-id": f"ev-{seed}-{i}", "ce-source": "/warehouse/eu",
                           "ce-type": SHIPPED, "ce-subject": f"orders/o-{i}", "Content-Type": "application/json",
                           "x-functions-key": "demo-publisher"}  # fmt: skip
                runtime.http("events_api", "/api/events", headers, json.dumps(data).encode())
            else:
                event = {"id": f"ev-{seed}-{i}", "source": "/warehouse/eu", "type": SHIPPED, "specversion": "1.0",
                         "data": data, "subject": f"orders/o-{i}"}  # fmt: skip
                runtime.cloudevent("order_events", event)
    for i in range(report.orders):
        order = {"orderId": f"web-{seed}-{i}", "customerId": "c-web", "amount": 10.0 + i, "currency": "EUR",
                 "items": [{"sku": "gift", "quantity": 1}]}  # fmt: skip
        copies = [order] * rng.randint(1, 3) + ([{**order, "amount": 1.0}] if i % 30 == 0 else [])
        for body in copies:  # client retries with the same key; sometimes a changed body (422)
            report.requests += 1
            headers = {"Idempotency-Key": f"idem-{seed}-{i}", "x-functions-key": "demo-client",
                       "Content-Type": "application/json"}  # fmt: skip
            status, response_headers = runtime.http("orders_api", "/api/orders", headers, json.dumps(body).encode())
            replay = " replayed" if "Idempotent-Replayed" in response_headers else ""
            report.statuses[f"{status}{replay}"] += 1  # type: ignore[index]
    store = orders_app.queue_consumer().store
    for item in store.scan():
        if item.entity == "shipment" and str(item.data.get("trackingNumber", "")).startswith(f"T-{seed}-"):
            report.shipments += 1
        elif item.entity == "order" and str(item.data.get("orderId", "")).startswith(f"web-{seed}-"):
            report.api_orders += 1
    return report
