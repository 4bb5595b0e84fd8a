"""The recipes (infra/recipes.json, read by main.bicep): what each recipe adds to a deployment
without it — resources and their counts, app settings, alerts, and nothing else — and a bad
recipes file refused by main.bicep (the allowed names) and by every check. Read from the parsed
templates (lab.infra_checks.Deployment), without a Bicep compiler; computed against the
deployment as it is, so that an app's own queues leave these true (the example's default
inventory is tests/example/test_example_infra.py's)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lab.infra_checks import (
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
from tests.infra.test_infra import infra_copy

RECIPES = [
    "topic",
    "outbox",
    "sessions",
    "batch",
    "eventhubs",
    "http",
    "cloudevents-http",
    "schedule",
    "payments",
    "queue",
    "blob-import",
    "balances",
]
# Fixed so that the private endpoints are counted; every other parameter takes any value.
NETWORK = {"vnetEnabled": True, "dedupStore": "table"}

# What each recipe needs, added to a deployment that has none of it: resources ("file:symbol[name]"
# per named entity, else "file:symbol": how many more; the private endpoints'
# network.bicep:privateEndpoints), app settings and log alerts (alerts.bicep:rules counts them).
# A named entity, a setting or an alert the deployment has already (an app's own Storage queue
# brings the queue service, its connection and the poison-queue alert) is not added again.
ADDS: dict[str, tuple[dict[str, int], set[str], set[str]]] = {
    "topic": ({"servicebus.bicep:orderEvents[order-events]": 1, "servicebus.bicep:subscriptions[billing]": 1,
               "servicebus.bicep:subscriptions[shipping]": 1, "roles.bicep:subscriptionReceivers": 2,
               "roles.bicep:orderTopicSender": 1},
              {"ORDER_TOPIC", "BILLING_SUBSCRIPTION", "SHIPPING_SUBSCRIPTION"}, set()),
    "outbox": ({"servicebus.bicep:orderEvents[order-events]": 1, "roles.bicep:orderTopicSender": 1},
               {"ORDER_ACCEPTED_TOPIC"}, {"dedup-outbox-backlog", "dedup-outbox-sweep-behind"}),
    "sessions": ({"servicebus.bicep:orderStatus[order-status]": 1, "roles.bicep:queueReceivers": 1,
                 "roles.bicep:queueCanarySenders": 1},
                 {"ORDER_STATUS_QUEUE"}, set()),
    "batch": ({"servicebus.bicep:moreQueues[ledger]": 1, "roles.bicep:queueReceivers": 1,
                 "roles.bicep:queueCanarySenders": 1}, {"LEDGER_QUEUE"}, set()),
    "balances": ({"servicebus.bicep:moreQueues[balances]": 1, "roles.bicep:queueReceivers": 1,
                 "roles.bicep:queueCanarySenders": 1}, {"BALANCES_QUEUE"},
                 set()),
    "eventhubs": ({"eventhubs.bicep:namespace": 1, "eventhubs.bicep:shipments": 1, "roles.bicep:hubReceiver": 1,
                   "network.bicep:privateEndpoints": 1, "network.bicep:zoneGroups": 1},
                  {"EventHubConnection__fullyQualifiedNamespace", "EventHubConnection__credential",
                   "EventHubConnection__clientId", "SHIPMENT_HUB"}, {"dedup-parked"}),
    "http": ({}, set(), set()),
    "cloudevents-http": ({}, set(), set()),
    "schedule": ({}, set(), set()),
    "payments": ({}, {"PAYMENT_API_URL"}, {"dedup-escalations"}),
    "queue": ({"storage-queues.bicep:queueService[default]": 1, "storage-queues.bicep:consumed[returns]": 1,
               "storage-queues.bicep:poison": 1, "roles.bicep:storageQueueReaders": 1,
               "roles.bicep:storageQueueProcessors": 1, "roles.bicep:poisonSenders": 1},
              {"RETURNS_QUEUE", "StorageQueueConnection__queueServiceUri", "StorageQueueConnection__credential",
               "StorageQueueConnection__clientId"}, {"storage-poison-queue"}),
    "blob-import": ({"blob-imports.bicep:imports": 1, "blob-imports.bicep:systemTopic": 1,
                     "blob-imports.bicep:deadLetterWriter": 1, "roles.bicep:queueContributor": 1},
                    {"IMPORTS_CONTAINER", "ImportsConnection__blobServiceUri", "ImportsConnection__queueServiceUri",
                     "ImportsConnection__credential", "ImportsConnection__clientId"}, {"storage-poison-queue"}),
}  # fmt: skip


def deployed(recipes: list[str], parameters: dict[str, Any] | None = None) -> Counter[str]:
    """How many entities each declaration deploys: a key per named entity, else per declaration."""
    found: Counter[str] = Counter()
    for r in Deployment(INFRA, recipes, parameters).resources:
        if not r.existing:
            found.update({f"{r.file}:{entity}": 1 if r.names else r.count or 0 for entity in r.entities})
    return found


def alerts(recipes: list[str]) -> list[str]:
    _, scope = Deployment(INFRA, recipes).calls["alerts"]
    return [rule["name"] for rule in scope("logAlerts")]


def added(recipes: list[str], to: list[str] | None = None) -> dict[str, int]:
    """What switching ``recipes`` on adds to the deployment with ``to`` (default: none on)."""
    before, after = deployed(to or [], NETWORK), deployed(sorted({*(to or []), *recipes}), NETWORK)
    assert not before - after, f"a recipe removed resources: {before - after}"
    return dict(after - before)


def settings(recipes: list[str]) -> set[str]:
    return set(Deployment(INFRA, recipes).app_settings())


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


SHARED = {"roles.bicep:orderTopicSender"}  # one role assignment, whichever of topic and outbox deploys it


def expected(recipe: str, to: list[str]) -> tuple[dict[str, int], set[str], set[str]]:
    """What ``recipe`` adds to the deployment with ``to`` on: ADDS, less what it has already."""
    resources, names, rules = ADDS[recipe]
    before = deployed(to, NETWORK)
    new_rules = rules - set(alerts(to))
    return ({**{key: n for key, n in resources.items() if not ((key.endswith("]") or key in SHARED) and before[key])},
             **({"alerts.bicep:rules": len(new_rules)} if new_rules else {})},
            names - settings(to), new_rules)  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_adds_its_resources_settings_and_alerts(recipe: str) -> None:
    resources, added_settings, rules = expected(recipe, [])
    assert added([recipe]) == resources
    assert settings([recipe]) - settings([]) == added_settings
    assert set(alerts([recipe])) - set(alerts([])) == rules


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_adds_the_same_beside_every_other(recipe: str) -> None:
    """Switched on last, each adds what it adds alone — but what another already deployed
    (topic and outbox share the one topic and its sender role, queue and blob-import the
    poison-queue alert)."""
    others = [name for name in RECIPES if name != recipe]
    resources, added_settings, _ = expected(recipe, others)
    assert added([recipe], to=others) == resources
    assert settings(RECIPES) - settings(others) == added_settings


def test_every_recipe_on_adds_them_all_once() -> None:
    """Switched on one after another, each adds what it needs and the others had not: all on at
    once adds the same."""
    total: Counter[str] = Counter()
    names: set[str] = set()
    for done, recipe in enumerate(RECIPES):
        resources, added_settings, _ = expected(recipe, RECIPES[:done])
        total.update(resources)
        names |= added_settings
    assert total["servicebus.bicep:orderEvents[order-events]"] == 1  # topic and outbox share it
    assert added(RECIPES) == dict(total)
    assert settings(RECIPES) == settings([]) | names


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
    policies = run("lab.infra_checks", "policies", str(copy))
    assert policies.returncode == 1 and "POLICY " in policies.stdout and "unknown recipe 'kafka'" in policies.stdout
    for check in ("retention", "leases"):
        done = run("lab.delivery_checks", check, str(copy))
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr.startswith("delivery_checks: error: ") and "unknown recipe 'kafka'" in done.stderr


def test_the_commands_read_the_recipes_file(tmp_path: Path) -> None:
    copy = infra_copy(tmp_path, recipes=["sessions", "eventhubs"])
    leases, retention = run("lab.delivery_checks", "leases", str(copy)), run("lab.delivery_checks", "retention",
                                                                               str(copy))  # fmt: skip
    for done in (leases, retention):
        assert done.returncode == 0 and 'recipes ["sessions", "eventhubs"]' in done.stdout, done.stdout
    assert "modules/servicebus.bicep:orderStatus[order-status]: maxDeliveryCount 10" in leases.stdout
    assert "modules/eventhubs.bicep:shipments (event hubs): TTL 7.00 days" in retention.stdout
    assert "modules/servicebus.bicep:moreQueues[ledger]" not in leases.stdout + retention.stdout  # batch is off
    policies = run("lab.infra_checks", "policies", str(copy))
    assert policies.returncode == 0 and 'recipes ["sessions", "eventhubs"], 0 policy violations' in policies.stdout


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


def test_fixed_parameters_decide_too(tmp_path: Path) -> None:
    """The default deployment reads every variant unless a parameter is fixed."""
    copy = infra_copy(tmp_path)  # with an Event Grid subscription, whether the app has one or not
    calls = Deployment(copy, []).calls
    subscriptions = {call for call, (path, _) in calls.items() if path == "modules/eventgrid-subscription.bicep"}
    assert {"network", "cosmos"} <= set(calls) and subscriptions
    fixed = Deployment(copy, [], {"vnetEnabled": False, "dedupStore": "table", "deployEventSubscription": False})
    assert not {"network", "cosmos", "eventHubs", *subscriptions} & set(fixed.calls)
