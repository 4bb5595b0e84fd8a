"""The example's own infra, as shipped: the orders queue and the order_events subscription with
their timing, the recipes' entities read by their names, nothing of a recipe deployed while it
is off, the example's app settings and alerts. Checked by name, so that an app's own queues and
subscriptions beside them change nothing here (tests/infra holds the rules for all of them)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from lab.delivery_checks import Redelivery, redeliveries
from lab.infra_checks import INFRA, Deployment, allowed_recipes

ALL = allowed_recipes(INFRA)
ORDERS = Redelivery("modules/servicebus.bicep:orders", "service bus", 10, timedelta(days=14), timedelta(minutes=1))
ORDER_EVENTS = Redelivery("modules/eventgrid-subscription.bicep:subscription[order-events]", "event grid", 30,
                          timedelta(days=1))  # fmt: skip
SETTINGS = {
    "ServiceBusConnection__fullyQualifiedNamespace", "ServiceBusConnection__credential",
    "ServiceBusConnection__clientId", "ORDERS_QUEUE", "DEDUP_STORE", "DEDUP_STORAGE_ENDPOINT", "DEDUP_RETENTION",
    "DEDUP_DEAD_LETTER_RETENTION",
    "DEDUP_MAX_DELIVERY_COUNT", "DEDUP_OUTGOING_MAX_BYTES", "PYTHON_THREADPOOL_THREAD_COUNT", "COSMOS_ENDPOINT",
    "COSMOS_DATABASE", "COSMOS_CONTAINER", "COSMOS_DEADLETTER_CONTAINER", "EVENTGRID_TOPIC_ENDPOINT",
}  # fmt: skip
RECIPE_SETTINGS = {"ORDER_TOPIC", "BILLING_SUBSCRIPTION", "SHIPPING_SUBSCRIPTION", "ORDER_ACCEPTED_TOPIC",
                   "ORDER_STATUS_QUEUE", "LEDGER_QUEUE", "BALANCES_QUEUE", "SHIPMENT_HUB",
                   "PAYMENT_API_URL"}  # fmt: skip
ALERTS = ["dedup-conflicts", "dedup-transient-rate", "dedup-duplicate-rate", "dedup-unaccounted", "dedup-expired",
          "dedup-purge-backlog"]  # fmt: skip


def places(recipes: list[str]) -> dict[str, Redelivery]:
    return {place.name: place for place in redeliveries(INFRA, recipes)}


def test_the_default_deployment_redelivers_from_the_orders_queue_and_the_event_subscription() -> None:
    found = places([])
    assert (found[ORDERS.name], found[ORDER_EVENTS.name]) == (ORDERS, ORDER_EVENTS)
    assert not [name for name in found if "ledger" in name or "order-status" in name or "eventhubs" in name]


def test_every_recipes_entity_is_read_by_its_name() -> None:
    found = places(ALL)
    assert (found[ORDERS.name], found[ORDER_EVENTS.name]) == (ORDERS, ORDER_EVENTS)
    assert {"modules/servicebus.bicep:moreQueues[ledger]", "modules/servicebus.bicep:subscriptions[billing]",
            "modules/servicebus.bicep:subscriptions[shipping]"} <= set(found)  # fmt: skip
    assert found["modules/servicebus.bicep:orderStatus[order-status]"].lock == timedelta(minutes=1)  # the session lock
    assert found["modules/eventhubs.bicep:shipments"] == Redelivery("modules/eventhubs.bicep:shipments", "event hubs",
                                                                    1, timedelta(days=7))  # fmt: skip


def test_the_default_deployment_has_no_recipe_resources() -> None:
    """Over every value of the other parameters (vnetEnabled, dedupStore, ...): no Event Hubs
    namespace, no order topic, no recipe queue; the example's settings and alerts."""
    deployment = Deployment(INFRA, [])
    resources = [r for r in deployment.resources if not r.existing]
    types = {r.type for r in resources}
    assert not {t for t in types if t.startswith("Microsoft.EventHub/")}, types
    names = {name for r in resources if r.type.startswith("Microsoft.ServiceBus/") for name in r.names}
    assert "orders" in names and not {"order-events", "order-status", "ledger", "billing", "shipping"} & names
    receivers = [r.symbol for r in resources if "serviceBusDataReceiver" in json.dumps(r.properties)]
    assert {"receiver", "queuePeeker"} <= set(receivers)  # the app's on the orders queue, the optional operator's
    settings = set(deployment.app_settings())
    assert settings >= SETTINGS and not RECIPE_SETTINGS & settings
    _, alerts = deployment.calls["alerts"]
    own_storage_queues = re.search(r"^var appStorageQueues = \[\s*'", (INFRA / "main.bicep").read_text(), re.M)
    assert [rule["name"] for rule in alerts("logAlerts")] == ALERTS + ["storage-poison-queue"] * bool(
        own_storage_queues
    )


def test_the_app_knows_the_same_recipe_names() -> None:
    """recipes/ (the app's side: a module per recipe, the orders consumer's features) and
    main.bicep name the same recipes."""
    recipes = pytest.importorskip("recipes")
    assert sorted([*recipes.MODULES, *recipes.FEATURES]) == sorted(ALL)
