"""The recipes (infra/recipes.json, read by main.bicep): what the default deployment creates,
what each recipe adds — resources and their counts, app settings, alerts — and a bad recipes
file refused by main.bicep (the allowed names) and by every check. Read from the parsed
templates (tools.infra_checks.Deployment), without a Bicep compiler."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.infra.test_infra import infra_copy
from tools.delivery_checks import redeliveries
from tools.infra_checks import (
    INFRA,
    ROOT,
    UNKNOWN,
    Deployment,
    RecipeError,
    Scope,
    allowed_recipes,
    parse,
    policy_violations,
    read_recipes,
)

RECIPES = ["topic", "outbox", "sessions", "batch", "eventhubs", "http", "cloudevents-http", "schedule", "payments"]
# Fixed so that the private endpoints are counted; every other parameter takes any value.
NETWORK = {"vnetEnabled": True, "dedupStore": "table"}

DEFAULT_SETTINGS = {
    "ServiceBusConnection__fullyQualifiedNamespace", "ServiceBusConnection__credential",
    "ServiceBusConnection__clientId", "ORDERS_QUEUE", "DEDUP_STORE", "DEDUP_STORAGE_ENDPOINT", "DEDUP_RETENTION",
    "DEDUP_MAX_DELIVERY_COUNT", "DEDUP_OUTGOING_MAX_BYTES", "PYTHON_THREADPOOL_THREAD_COUNT", "COSMOS_ENDPOINT",
    "COSMOS_DATABASE", "COSMOS_CONTAINER", "COSMOS_DEADLETTER_CONTAINER",
}  # fmt: skip
DEFAULT_ALERTS = ["dedup-conflicts", "dedup-transient-rate", "dedup-duplicate-rate", "dedup-purge-backlog"]

# What each recipe adds to the default deployment: resources ("file:symbol": entities; the
# alerts' count is alerts.bicep:rules, the private endpoints' network.bicep:privateEndpoints),
# app settings and log alerts.
ADDS: dict[str, tuple[dict[str, int | None], set[str], set[str]]] = {
    "topic": ({"servicebus.bicep:orderEvents": 1, "servicebus.bicep:subscriptions": 2,
               "roles.bicep:subscriptionReceivers": 2},
              {"ORDER_TOPIC", "BILLING_SUBSCRIPTION", "SHIPPING_SUBSCRIPTION"}, set()),
    "outbox": ({"servicebus.bicep:orderEvents": 1, "roles.bicep:outboxSender": 1, "alerts.bicep:rules": 6},
               {"ORDER_ACCEPTED_TOPIC"}, {"dedup-outbox-backlog", "dedup-outbox-sweep-behind"}),
    "sessions": ({"servicebus.bicep:orderStatus": 1, "roles.bicep:queueReceivers": 1}, {"ORDER_STATUS_QUEUE"}, set()),
    "batch": ({"servicebus.bicep:moreQueues": 1, "roles.bicep:queueReceivers": 1}, {"LEDGER_QUEUE"}, set()),
    "eventhubs": ({"eventhubs.bicep:namespace": 1, "eventhubs.bicep:shipments": 1, "roles.bicep:hubReceiver": 1,
                   "alerts.bicep:rules": 5, "network.bicep:privateEndpoints": 5, "network.bicep:zoneGroups": 5},
                  {"EventHubConnection__fullyQualifiedNamespace", "EventHubConnection__credential",
                   "EventHubConnection__clientId", "SHIPMENT_HUB"}, {"dedup-parked"}),
    "http": ({}, set(), set()),
    "cloudevents-http": ({}, set(), set()),
    "schedule": ({}, set(), set()),
    "payments": ({"alerts.bicep:rules": 5}, {"PAYMENT_API_URL"}, {"dedup-escalations"}),
}  # fmt: skip


def deployed(recipes: list[str], parameters: dict[str, Any] | None = None) -> dict[str, int | None]:
    return {f"{r.file}:{r.symbol}": r.count for r in Deployment(INFRA, recipes, parameters).resources if not r.existing}


def alerts(recipes: list[str]) -> list[str]:
    _, scope = Deployment(INFRA, recipes).calls["alerts"]
    return [rule["name"] for rule in scope("logAlerts")]


def added(recipes: list[str]) -> dict[str, int | None]:
    default, on = deployed([], NETWORK), deployed(recipes, NETWORK)
    assert set(default) <= set(on), "a recipe removed a resource of the default deployment"
    return {key: count for key, count in on.items() if default.get(key) != count}


def test_the_default_deployment_has_no_recipe_resources() -> None:
    """Over every value of the other parameters (vnetEnabled, dedupStore, ...): no Event Hubs
    namespace, no topic or subscription, no queue but orders."""
    resources = [r for r in Deployment(INFRA, []).resources if not r.existing]
    types = {r.type for r in resources}
    assert not {t for t in types if t.startswith("Microsoft.EventHub/")}, types
    assert not {t for t in types if t.startswith("Microsoft.ServiceBus/namespaces/topics")}, types
    assert [(r.symbol, r.count) for r in resources if r.type == "Microsoft.ServiceBus/namespaces/queues"] == [
        ("orders", 1)
    ]
    receivers = [r.symbol for r in resources if "serviceBusDataReceiver" in json.dumps(r.properties)]
    assert receivers == ["receiver", "queuePeeker"]  # the app's on the orders queue, the optional operator's
    assert set(Deployment(INFRA, []).app_settings()) == DEFAULT_SETTINGS
    assert alerts([]) == DEFAULT_ALERTS
    assert deployed([], NETWORK)["network.bicep:privateEndpoints"] == 4  # blob, queue, table, Service Bus


def test_main_declares_the_event_hubs_namespace_only_under_its_recipe() -> None:
    main = parse(INFRA / "main.bicep")
    assert not [s for s in main.get("resources", {}).values() if s["type"].startswith("Microsoft.EventHub/")]
    calls = [call for call, module in main["modules"].items()
             if any(spec["type"] == "Microsoft.EventHub/namespaces" and not spec.get("existing")
                    for spec in parse(INFRA / module["detail"]["path"]).get("resources", {}).values())]  # fmt: skip
    assert calls == ["eventHubs"]
    assert main["modules"]["eventHubs"]["config"]["condition"] == "withEventHubs"
    assert main["variables"]["withEventHubs"]["value"] == {
        "function": {"type": "contains", "parameters": {"container": "recipes", "item_to_find": "eventhubs"}}
    }


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_adds_its_resources_settings_and_alerts(recipe: str) -> None:
    resources, settings, rules = ADDS[recipe]
    assert added([recipe]) == resources
    assert set(Deployment(INFRA, [recipe]).app_settings()) - DEFAULT_SETTINGS == settings
    assert set(alerts([recipe])) - set(DEFAULT_ALERTS) == rules


def test_every_recipe_on_adds_them_all_once() -> None:
    """topic and outbox share the one topic; sessions and batch each add a queue and its role."""
    assert added(RECIPES) == {
        "servicebus.bicep:orderEvents": 1, "servicebus.bicep:subscriptions": 2, "servicebus.bicep:orderStatus": 1,
        "servicebus.bicep:moreQueues": 1, "eventhubs.bicep:namespace": 1, "eventhubs.bicep:shipments": 1,
        "roles.bicep:subscriptionReceivers": 2, "roles.bicep:queueReceivers": 2, "roles.bicep:outboxSender": 1,
        "roles.bicep:hubReceiver": 1, "alerts.bicep:rules": 8, "network.bicep:privateEndpoints": 5,
        "network.bicep:zoneGroups": 5,
    }  # fmt: skip
    expected = DEFAULT_SETTINGS.union(*(settings for _, settings, _ in ADDS.values()))
    assert set(Deployment(INFRA, RECIPES).app_settings()) == expected


def test_the_receive_roles_name_the_entities_the_recipes_deploy() -> None:
    _, roles = Deployment(INFRA, ["topic", "batch"]).calls["roles"]
    assert roles("receiveQueues") == ["ledger"] and roles("topicSubscriptions") == ["billing", "shipping"]
    assert roles("orderTopicName") == "order-events" and roles("outbox") is False
    assert Deployment(INFRA, ["outbox"]).calls["roles"][1]("topicSubscriptions") == []  # sends, receives nothing
    _, servicebus = Deployment(INFRA, ["topic", "batch"]).calls["serviceBus"]
    assert (servicebus("queues"), servicebus("topicSubscriptions")) == (["ledger"], ["billing", "shipping"])


def test_your_own_queue_gets_the_queue_settings_its_receive_role_and_the_checks(tmp_path: Path) -> None:
    """infra/README.md: a consumer's queue of your own is one name in appQueues."""
    copy = infra_copy(tmp_path, edits=(("main.bicep", "var appQueues = []", "var appQueues = ['invoices']"),),
                      recipes=["batch"])  # fmt: skip
    deployment = Deployment(copy)
    assert deployment.calls["serviceBus"][1]("queues") == ["invoices", "ledger"]
    assert deployment.calls["roles"][1]("receiveQueues") == ["invoices", "ledger"]
    assert [(p.name, p.count) for p in redeliveries(copy) if p.broker == "service bus"] == [
        ("modules/servicebus.bicep:orders", 1), ("modules/servicebus.bicep:moreQueues", 2)]  # fmt: skip
    assert policy_violations(copy) == []


# -- an unknown name ---------------------------------------------------------------------


def test_main_bicep_allows_exactly_the_recipe_names() -> None:
    """An unknown name in recipes.json fails the deployment: the parameter's allowed values
    (each element of an array parameter must be one)."""
    spec = parse(INFRA / "main.bicep")["parameters"]["recipes"]
    assert spec["type"] == "array" and allowed_recipes(INFRA) == RECIPES
    assert spec["default"] == {"function": {"type": "load_json_content", "parameters": {
        "file_path": "recipes.json", "json_path": None, "encoding": None}}}  # fmt: skip
    assert "recipes" not in json.loads((INFRA / "main.parameters.json").read_text())["parameters"]  # the file decides


@pytest.mark.parametrize(("content", "expected"), [
    ('["topic", "kafka"]', "unknown recipe 'kafka'; known: topic, outbox, sessions"),
    ('"topic"', "not a JSON array of recipe names: 'topic'"),
    ("[1]", "not a JSON array of recipe names: [1]"),
    ("[topic]", "Expecting value"),
    (None, "No such file"),
])  # fmt: skip
def test_a_bad_recipes_file_is_refused(tmp_path: Path, content: str | None, expected: str) -> None:
    copy = tmp_path / "infra"
    shutil.copytree(INFRA, copy)
    if content is None:
        (copy / "recipes.json").unlink()
    else:
        (copy / "recipes.json").write_text(content)
    with pytest.raises(RecipeError, match=r"recipes\.json: ") as raised:
        read_recipes(copy)
    assert expected in str(raised.value)
    assert policy_violations(copy) == [str(raised.value)]
    with pytest.raises(RecipeError):
        Deployment(copy)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_commands_refuse_an_unknown_recipe(tmp_path: Path) -> None:
    copy = infra_copy(tmp_path, recipes=["topic", "kafka"])
    policies = run("tools.infra_checks", "policies", str(copy))
    assert policies.returncode == 1 and "POLICY " in policies.stdout and "unknown recipe 'kafka'" in policies.stdout
    for check in ("retention", "leases"):
        done = run("tools.delivery_checks", check, str(copy))
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr.startswith("delivery_checks: error: ") and "unknown recipe 'kafka'" in done.stderr


def test_the_commands_read_the_recipes_file(tmp_path: Path) -> None:
    copy = infra_copy(tmp_path, recipes=["sessions", "eventhubs"])
    leases, retention = run("tools.delivery_checks", "leases", str(copy)), run("tools.delivery_checks", "retention",
                                                                               str(copy))  # fmt: skip
    for done in (leases, retention):
        assert done.returncode == 0 and 'recipes ["sessions", "eventhubs"]' in done.stdout, done.stdout
    assert "modules/servicebus.bicep:orderStatus: maxDeliveryCount 10" in leases.stdout
    assert "modules/eventhubs.bicep:shipments (event hubs): TTL 7.00 days" in retention.stdout
    assert "modules/servicebus.bicep:moreQueues" not in leases.stdout + retention.stdout  # batch is off
    policies = run("tools.infra_checks", "policies", str(copy))
    assert policies.returncode == 0 and 'recipes ["sessions", "eventhubs"], 0 policy violations' in policies.stdout


def test_the_app_knows_the_same_recipe_names() -> None:
    """recipes/ (the app's side: a module per recipe, the orders consumer's features) and
    main.bicep name the same recipes."""
    app = pytest.importorskip("recipes")
    if not hasattr(app, "MODULES") or not hasattr(app, "FEATURES"):
        pytest.skip("recipes/ does not name its recipes (MODULES, FEATURES)")
    assert sorted([*app.MODULES, *app.FEATURES]) == sorted(allowed_recipes(INFRA))


# -- the evaluation of conditions ----------------------------------------------------------------

EXPRESSIONS = """
param vnetEnabled bool
param recipes array
var on = contains(recipes, 'x')
var onAndParameter = on && vnetEnabled
var onOrParameter = on || vnetEnabled
var notParameter = !vnetEnabled
var listIfOn = on ? ['q'] : []
var listIfParameter = vnetEnabled ? ['q'] : []
var parenthesised = (vnetEnabled == true) ? 'y' : ''
var settings = union({ A: 'a' }, on ? { B: 'b' } : {})
var joined = concat(['q'], listIfOn)
var notEmpty = !empty(listIfOn)
"""
NAMES = ["onAndParameter", "onOrParameter", "notParameter", "listIfOn", "listIfParameter", "parenthesised",
         "settings", "joined", "notEmpty"]  # fmt: skip


@pytest.mark.parametrize(("recipes", "values"), [
    ([], [False, UNKNOWN, UNKNOWN, [], UNKNOWN, UNKNOWN, {"A": "a"}, ["q"], False]),
    (["x"], [UNKNOWN, True, UNKNOWN, ["q"], UNKNOWN, UNKNOWN, {"A": "a", "B": "b"}, ["q", "q"], True]),
])  # fmt: skip
def test_the_recipes_decide_and_a_parameter_stays_open(tmp_path: Path, recipes: list[str], values: list[Any]) -> None:
    """A recipe's flag is known; a parameter may take any value, so what depends on it alone
    is deployed (UNKNOWN is not False) — unless the recipe decides (off && anything)."""
    template = tmp_path / "t.bicep"
    template.write_text(EXPRESSIONS)
    scope = Scope(parse(template), {"vnetEnabled": UNKNOWN, "recipes": recipes})
    assert [scope(name) for name in NAMES] == values


def test_fixed_parameters_decide_too() -> None:
    """The default deployment reads every variant unless a parameter is fixed."""
    assert {"network", "cosmos", "eventSubscription"} <= set(Deployment(INFRA, []).calls)
    fixed = Deployment(INFRA, [], {"vnetEnabled": False, "dedupStore": "table", "deployEventSubscription": False})
    assert not {"network", "cosmos", "eventSubscription", "eventHubs"} & set(fixed.calls)
