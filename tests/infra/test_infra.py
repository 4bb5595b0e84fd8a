"""infra/ without a Bicep compiler: every template parses, the security policies hold on
the parsed tree (and fail on deliberately broken copies), and the retention check — on the
deployment as infra/recipes.json has it, with no recipe, each one and every one on
(tests/infra/test_recipes.py: what each adds). Rules over whatever infra/ deploys, so that an
app's own queues and subscriptions are checked as the template's are; the example's own
inventory is tests/example/test_example_infra.py's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import isodate
import pytest

from lab.delivery_checks import app_settings, lease_check, redeliveries, retention_check
from lab.infra_checks import (
    INFRA,
    ROOT,
    Deployment,
    allowed_recipes,
    bicep_files,
    blob_triggered,
    parameter_values,
    parse,
    policy_violations,
    subscribed_functions,
    timespan,
)

HOST = json.loads((ROOT / "host.json").read_text())
ALL = allowed_recipes(INFRA)  # every recipe on
# As infra/recipes.json has it (None), none, each one, every one.
DEPLOYMENTS = pytest.mark.parametrize("recipes", [None, [], *([name] for name in ALL), ALL],
                                      ids=["as-configured", "no-recipe", *ALL, "all-recipes"])  # fmt: skip


def test_every_template_parses() -> None:
    files = bicep_files(INFRA)
    assert len(files) >= 9
    for path in files:
        assert isinstance(parse(path), dict), path


@DEPLOYMENTS
def test_the_templates_meet_every_policy(recipes: list[str]) -> None:
    assert policy_violations(INFRA, recipes) == []


TOPIC_DETECTION = "'order-events'\n  properties: {\n    requiresDuplicateDetection: true"
BREAKAGES = [
    ("modules/servicebus.bicep", "requiresDuplicateDetection: true", "requiresDuplicateDetection: false",
     "duplicate detection off"),
    ("modules/servicebus.bicep", TOPIC_DETECTION, TOPIC_DETECTION.replace("true", "false"),
     "orderEvents[order-events]: duplicate detection off"),
    ("modules/servicebus.bicep", "name: 'Standard', tier: 'Standard'", "name: 'Basic', tier: 'Basic'",
     "Standard or Premium"),
    ("modules/servicebus.bicep", "disableLocalAuth: true", "disableLocalAuth: false", "local (SAS) auth"),
    ("modules/storage.bicep", "allowSharedKeyAccess: false", "allowSharedKeyAccess: true", "shared keys"),
    ("modules/cosmos.bicep", "disableLocalAuth: true", "disableLocalAuth: false", "Cosmos DB keys"),
    ("modules/eventgrid.bicep", "inputSchema: 'CloudEventSchemaV1_0'", "inputSchema: 'EventGridSchema'",
     "not CloudEvents"),
    ("modules/monitoring.bicep", "DisableLocalAuth: true", "DisableLocalAuth: false", "App Insights"),
    ("modules/functionapp.bicep", "version: pythonVersion", "version: '3.11'", "runtime is not Python 3.12 or 3.13"),
    ("main.bicep", "    pythonVersion: pythonVersion\n", "", "not given the pythonVersion parameter"),
    ("main.bicep", "@allowed(['3.12', '3.13'])", "@allowed(['3.12', '3.13', '3.14'])",
     "main.bicep: pythonVersion does not allow exactly"),
    ("modules/functionapp.bicep", "@allowed(['3.12', '3.13'])", "@allowed(['3.11', '3.12', '3.13'])",
     "functionapp.bicep: pythonVersion does not allow exactly"),
    ("modules/roles.bicep", "  scope: ordersQueue\n", "", "not scoped to a resource"),
    ("modules/roles.bicep", "  scope: queues[i]\n", "", "not scoped to a resource"),
    ("modules/functionapp.bicep", "PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'",
     "PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'\n  Storage: listKeys(storageAccountName, '2023-05-01').keys[0].value",
     "secret material"),
    ("main.bicep", "ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace",
     "ServiceBusConnection: 'Endpoint=sb://x/'", "connection string"),
    ("main.bicep", "defaultTtlSeconds: dedupRetentionDays * 86400", "defaultTtlSeconds: 86400",
     "Cosmos defaultTtl not from the retention"),
    ("main.bicep", "DEDUP_RETENTION: 'P${dedupRetentionDays}D'", "DEDUP_RETENTION: 'P30D'",
     "DEDUP_RETENTION not from the parameter"),
    ("modules/eventgrid-subscription.bicep", "endpointType: 'AzureFunction'", "endpointType: 'WebHook'",
     "not delivered to the function"),
    ("modules/monitoring.bicep", "features: { disableLocalAuth: true }", "features: {}", "Log Analytics local auth"),
    ("modules/functionapp.bicep", "name: 'scm'\n  properties: { allow: false }",
     "name: 'scm'\n  properties: { allow: true }", "scm basic publishing"),
    ("modules/roles.bicep", "  scope: deadLetterContainer\n", "  scope: storage\n", "beyond its dead-letter container"),
    ("modules/cosmos.bicep", "kind: 'Hash', version: 2 }", "kind: 'Hash' }", "partition key version"),
    ("modules/roles.bicep", "operatorPrincipalId, roleIds.serviceBusDataSender)\n  scope: ordersQueue\n",
     "operatorPrincipalId, roleIds.serviceBusDataSender)\n  scope: serviceBus\n", "operator's role reaches beyond"),
    ("modules/roles.bicep", "  scope: ordersQueue\n", "  scope: serviceBus\n", "receiver: receives beyond one queue"),
    ("modules/roles.bicep", "  scope: queues[i]\n", "  scope: serviceBus\n",
     "queueReceivers: receives beyond one queue"),
    ("modules/roles.bicep", "  scope: subscriptions[i]\n", "  scope: orderEventsTopic\n",
     "subscriptionReceivers: receives beyond one queue"),
    ("main.bicep", "EventHubConnection__credential: 'managedidentity'", "EventHubConnectionString: 'Endpoint=sb://x/'",
     "app setting EventHubConnectionString: a connection string"),
    ("modules/functionapp.bicep", "httpsOnly: true", "httpsOnly: false", "plain HTTP accepted"),
    ("modules/functionapp.bicep", "unauthenticatedClientAction: 'Return401'",
     "unauthenticatedClientAction: 'AllowAnonymous'", "Easy Auth lets unauthenticated calls through"),
    ("modules/functionapp.bicep", "excludedPaths: ['/runtime/webhooks/eventgrid']", "excludedPaths: ['/api']",
     "Easy Auth lets unauthenticated calls through"),
    ("modules/roles.bicep", "  scope: recordsTable\n", "  scope: storage\n", "operator's role reaches beyond"),
    ("modules/roles.bicep", "  scope: orderEventsTopic\n", "  scope: serviceBus\n", "Data Sender beyond one entity"),
    ("modules/roles.bicep", "  scope: shipmentHub\n", "  scope: eventHubs\n", "receives beyond one hub"),
    ("modules/roles.bicep", "roleIds.serviceBusDataSender)\n  scope: queues[i]\n",
     "roleIds.serviceBusDataSender)\n  scope: ordersQueue\n", "queue 'ledger': the canary cannot be sent through it"),
    ("modules/roles.bicep", "if (outbox || !empty(topicSubscriptions))", "if (outbox && empty(topicSubscriptions))",
     "subscription 'billing': the canary cannot be sent through it"),
    ("modules/eventgrid-subscription.bicep", "concat(eventTypes, ['dedup.canary'])", "eventTypes",
     "the canary's event type (dedup.canary) is filtered out"),
    ("modules/servicebus.bicep", "    publicNetworkAccess: privateOnly ? 'Disabled' : 'Enabled'\n", "",
     "public network access not tied to vnetEnabled"),
    ("modules/eventhubs.bicep", "disableLocalAuth: true", "disableLocalAuth: false", "Event Hubs local (SAS) auth"),
    ("modules/roles.bicep", "scope: '${cosmos.id}/dbs/${cosmosDatabase}'", "scope: cosmos.id",
     "Cosmos role scoped beyond a database"),
    ("modules/roles.bicep", "roleIds.storageQueueDataMessageProcessor)\n  scope: consumedQueues[i]\n",
     "roleIds.storageQueueDataMessageProcessor)\n  scope: storage\n", "a Storage queue role beyond one queue"),
    ("modules/roles.bicep", "  scope: poisonQueues[i]\n", "  scope: queueService\n",
     "poisonSenders: a Storage queue role beyond one queue"),
    ("modules/roles.bicep", "roleDefinitions', roleIds.storageQueueDataMessageProcessor)",
     "roleDefinitions', roleIds.storageQueueDataReader)", "Storage queue 'returns': the app has no processor role"),
]  # fmt: skip


# One more Event Grid subscription, for a copy whose app has none (its example removed).
SUBSCRIPTION_CALL = """
module aSubscription 'modules/eventgrid-subscription.bicep' = if (deployEventSubscription) {
  name: 'eventgrid-subscription-a'
  params: {
    name: 'a-subscription'
    eventTypes: ['com.example.a']
    topicName: eventGrid.outputs.name
    functionAppName: functionApp.outputs.name
    functionName: 'a_function'
    storageAccountName: storage.outputs.name
    deadLetterContainer: storage.outputs.eventDeadLetterContainer
    eventTimeToLiveInMinutes: eventTimeToLiveInMinutes
    maxDeliveryAttempts: eventMaxDeliveryAttempts
  }
  dependsOn: [roles]
}
"""


def with_an_event_subscription(infra: Path) -> None:
    """Make sure infra/ (a copy) deploys an Event Grid subscription, so that its policies are read."""
    if not any(path == "modules/eventgrid-subscription.bicep" for path, _ in Deployment(infra, []).calls.values()):
        (infra / "main.bicep").write_text((infra / "main.bicep").read_text() + SUBSCRIPTION_CALL)


@pytest.mark.parametrize(("file", "old", "new", "expected"), BREAKAGES, ids=[b[3] for b in BREAKAGES])
def test_a_broken_copy_fails_the_policies(tmp_path: Path, file: str, old: str, new: str, expected: str) -> None:
    """Each with every recipe on, so that the recipes' resources are read too."""
    broken = tmp_path / "infra"
    shutil.copytree(INFRA, broken)
    with_an_event_subscription(broken)
    target = broken / file
    text = target.read_text()
    assert old in text, f"{file} no longer contains {old!r}: update this test"
    target.write_text(text.replace(old, new, 1))
    violations = policy_violations(broken, ALL)
    assert any(expected in violation for violation in violations), violations


def test_a_template_with_a_syntax_error_does_not_parse(tmp_path: Path) -> None:
    broken = tmp_path / "broken.bicep"
    broken.write_text((INFRA / "modules/servicebus.bicep").read_text().replace("properties: {", "properties: {{", 1))
    with pytest.raises(Exception):  # noqa: B017 - the parser reports syntax errors in several types
        parse(broken)


# -- retention and leases (lab/delivery_checks.py) ------------------------------------------


def infra_copy(tmp_path: Path, parameters: dict[str, object] | None = None,
               edits: tuple[tuple[str, str, str], ...] = (), recipes: list[str] | None = None) -> Path:  # fmt: skip
    """A copy of infra/ with other parameter values, text replaced in a file, or other recipes;
    with an Event Grid subscription, whether the app has one or not (the checks read it)."""
    copy = tmp_path / "infra"
    shutil.copytree(INFRA, copy)
    with_an_event_subscription(copy)
    if recipes is not None:
        (copy / "recipes.json").write_text(json.dumps(recipes))
    params = json.loads((copy / "main.parameters.json").read_text())
    for name, value in (parameters or {}).items():
        params["parameters"][name] = {"value": value}
    (copy / "main.parameters.json").write_text(json.dumps(params))
    for file, old, new in edits:
        text = (copy / file).read_text()
        assert old in text, f"{file} no longer contains {old!r}: update this test"
        (copy / file).write_text(text.replace(old, new))
    return copy


@DEPLOYMENTS
def test_the_repository_passes_the_retention_and_lease_checks(recipes: list[str]) -> None:
    for report in (retention_check(INFRA, HOST, recipes), lease_check(INFRA, HOST, recipes)):
        assert report.ok, report.explain()
    [outbox] = [line for line in lease_check(INFRA, HOST, recipes).lines if line.startswith("outbox:")]
    window = isodate.parse_duration(parameter_values(INFRA)["duplicateDetectionWindow"])
    assert f"duplicate detection ({window}) drops" in outbox, outbox


REDELIVERING = {"Microsoft.ServiceBus/namespaces/queues": "service bus",
                "Microsoft.ServiceBus/namespaces/topics/subscriptions": "service bus",
                "Microsoft.EventHub/namespaces/eventhubs": "event hubs",
                "Microsoft.EventGrid/topics/eventSubscriptions": "event grid",
                "Microsoft.Storage/storageAccounts/queueServices/queues": "storage queue"}  # fmt: skip


@DEPLOYMENTS
def test_every_entity_that_redelivers_is_read_by_its_name(recipes: list[str] | None) -> None:
    """Each queue, subscription, hub and event subscription infra/ deploys is one place the
    checks read, named as deployed: ``file:symbol[name]`` (an app's own queue by its own name);
    a Storage poison queue (``<queue>-poison``) is none: nobody consumes it."""
    expected = sorted((f"{r.path}:{entity}", REDELIVERING[r.type]) for r in Deployment(INFRA, recipes).resources
                      if r.type in REDELIVERING and not r.existing and r.names for entity in r.entities
                      if not entity.endswith("-poison]"))  # fmt: skip
    assert expected, "no entity deployed redelivers"
    assert sorted((place.name, place.broker) for place in redeliveries(INFRA, recipes)) == expected
    assert all(place.count == 1 for place in redeliveries(INFRA, recipes))  # every name known: one place each


@pytest.mark.parametrize(
    "change",
    [
        {"dedupRetentionDays": 14},  # shorter than the message TTL alone
        {"messageTimeToLive": "P30D"},  # the queue keeps messages longer than the markers
        {"deadLetterResubmitDays": 30},  # operators resubmit after the markers are gone
        {"messageTimeToLive": "P20D", "maxDeliveryCount": 2000},  # 2000 deliveries x 5 min of lock
        {"eventTimeToLiveInMinutes": 60 * 24 * 30},  # Event Grid retries for 30 days
    ],
)
def test_markers_expiring_before_the_broker_stops_redelivering_fail(tmp_path: Path, change: dict[str, object]) -> None:
    report = retention_check(infra_copy(tmp_path, change), HOST)
    assert not report.ok and "FAIL" in report.explain()


def test_a_replay_from_the_hub_counts_with_the_eventhubs_recipe_only(tmp_path: Path) -> None:
    """Markers kept 7 days outlive queues that hold a message a day, not the hub's 7-day replay:
    switching the recipe on adds the hub's failure, and only it (whatever else the app deploys)."""
    change = {"dedupRetentionDays": 7, "deadLetterResubmitDays": 1, "messageTimeToLive": "P1D"}
    without = retention_check(infra_copy(tmp_path / "default", change, recipes=[]), HOST)
    report = retention_check(infra_copy(tmp_path / "eventhubs", change, recipes=["eventhubs"]), HOST)
    assert [failure.split(" ")[0] for failure in report.failures if failure not in without.failures] == [
        "modules/eventhubs.bicep:shipments"
    ], report.explain()
    assert not [f for f in without.failures if "eventhubs.bicep" in f], without.explain()


def service_bus_entities(infra: Path, recipes: list[str]) -> int:
    return sum(place.count for place in redeliveries(infra, recipes) if place.broker == "service bus")


def threads_needed(infra: Path, recipes: list[str]) -> int:
    """The worker's threads make check-leases requires for what ``infra`` deploys: 16 calls per
    Service Bus entity, a batch and the next one per Storage queue, the blob trigger's parallel
    runs, and HTTP's 16."""
    queues, blobs = HOST["extensions"]["queues"], HOST["extensions"]["blobs"]
    storage = sum(p.count for p in redeliveries(infra, recipes) if p.broker == "storage queue")
    return (service_bus_entities(infra, recipes) * 16 + storage * (queues["batchSize"] + queues["newBatchThreshold"])
            + (blobs["maxDegreeOfParallelism"] if blob_triggered(infra, recipes) else 0) + 16)  # fmt: skip


def test_the_thread_pool_counts_the_entities_the_recipes_deploy(tmp_path: Path) -> None:
    """Threads enough for the entities deployed with no recipe are too few once every recipe
    adds its entities: Service Bus entities, Storage queues, the blob trigger's parallel runs."""
    fewest, most = threads_needed(INFRA, []), threads_needed(INFRA, ALL)
    assert most > fewest
    [shipped] = re.findall(r"PYTHON_THREADPOOL_THREAD_COUNT: '\d+'", (INFRA / "main.bicep").read_text())
    edits = (("main.bicep", shipped, f"PYTHON_THREADPOOL_THREAD_COUNT: '{fewest}'"),)
    assert lease_check(infra_copy(tmp_path / "default", edits=edits, recipes=[]), HOST).ok
    report = lease_check(infra_copy(tmp_path / "all", edits=edits, recipes=ALL), HOST)
    assert [failure.split(" >= ")[0] for failure in report.failures] == [f"PYTHON_THREADPOOL_THREAD_COUNT {fewest}"]
    assert f"{service_bus_entities(INFRA, ALL)} Service Bus entities x maxConcurrentCalls 16" in report.failures[0]


QUEUE_VALUES = "    lockDuration: lockDuration\n    maxDeliveryCount: maxDeliveryCount\n    defaultMessageTimeToLive:"


@pytest.mark.parametrize("recipes", [[], ALL], ids=["no-recipe", "all-recipes"])
def test_literal_values_in_a_template_are_read_too(tmp_path: Path, recipes: list[str]) -> None:
    """Queues and subscriptions written with literal values (TTL P60D, 50 deliveries of 5 min)
    instead of the parameters fail, though the parameters did not change: each one deployed
    whose declaration was changed, by its name."""
    literal = "    lockDuration: 'PT5M'\n    maxDeliveryCount: 50\n    defaultMessageTimeToLive: 'P60D'\n    _old:"
    copy = infra_copy(tmp_path, edits=(("modules/servicebus.bicep", QUEUE_VALUES, literal),), recipes=recipes)
    failed = sorted(line.split(" ")[0] for line in retention_check(copy, HOST).failures)
    changed = sorted(f"{r.path}:{entity}" for r in Deployment(INFRA, recipes).resources
                     if r.path == "modules/servicebus.bicep" and not r.existing
                     and (r.properties.get("lockDuration"), r.properties.get("maxDeliveryCount")) == (
                         "lockDuration", "maxDeliveryCount") for entity in r.entities)  # fmt: skip
    assert failed == changed and changed


APP_LISTS = re.findall(r"^var (app\w+) = \[", (INFRA / "main.bicep").read_text(), re.MULTILINE)


def with_app_entity(infra: Path, name: str, listed: str = "appQueues") -> str:
    """Add ``name`` to one of main.bicep's lists of the app's own entities (``appQueues``: README,
    Start your own app; ``appStorageQueues``: docs/triggers.md), whatever it holds; the name
    added: ``name``, or ``name-2``… where the app's lists have it already."""
    main = infra / "main.bicep"
    [names] = re.findall(rf"^var {listed} = (\[.*?\])$", main.read_text(), re.MULTILINE)
    taken = set(re.findall(r"'([^']*)'", "".join(re.findall(r"^var app\w+ = \[.*?\]$", main.read_text(), re.M))))
    name = next(n for n in (name, *(f"{name}-{i}" for i in range(2, 100))) if n not in taken)
    more = [*re.findall(r"'([^']*)'", names), name]
    main.write_text(main.read_text().replace(f"var {listed} = {names}", f"var {listed} = {more!r}", 1))
    return name


@pytest.mark.parametrize("recipes", [[], ALL], ids=["no-recipe", "all-recipes"])
@pytest.mark.parametrize("listed", APP_LISTS)
def test_every_list_of_the_apps_own_entities_takes_a_users_name(tmp_path: Path, listed: str,
                                                                 recipes: list[str]) -> None:  # fmt: skip
    """Each ``var app… = [...]`` of main.bicep (a list added later too) deploys a name a user adds
    to it as an entity that redelivers, which every policy and check then reads by that name."""
    assert {"appQueues", "appStorageQueues"} <= set(APP_LISTS)
    copy = infra_copy(tmp_path, recipes=recipes)
    name = with_app_entity(copy, "users-own", listed)
    own = [p for p in redeliveries(copy, host=HOST) if p.name.endswith(f"[{name}]")]
    assert [p.count for p in own] == [1], f"{listed}: {name!r} is not one entity the checks read by its name"
    assert policy_violations(copy) == [], f"{listed}: a user's {name!r} breaks the policies"
    for report in (retention_check(copy, HOST), lease_check(copy, HOST)):
        assert report.ok and own[0].name in report.explain(), report.explain()


@pytest.mark.parametrize("recipes", [[], ALL], ids=["no-recipe", "all-recipes"])
def test_an_apps_own_queue_gets_the_queue_settings_its_receive_role_and_the_checks(
    tmp_path: Path, recipes: list[str]
) -> None:
    """infra/README.md: a consumer's own queue is one name in appQueues; it is deployed with the
    shared queue settings and a receive role, and the checks read it by its name."""
    copy = infra_copy(tmp_path, recipes=recipes)
    queue = with_app_entity(copy, "own-queue")
    _, servicebus = Deployment(copy).calls["serviceBus"]
    _, roles = Deployment(copy).calls["roles"]
    assert queue in servicebus("queues") and queue in roles("receiveQueues")
    own = f"modules/servicebus.bicep:moreQueues[{queue}]"
    assert [(p.broker, p.count) for p in redeliveries(copy) if p.name == own] == [("service bus", 1)]
    assert policy_violations(copy) == []
    for report in (retention_check(copy, HOST), lease_check(copy, HOST)):
        assert report.ok and own in report.explain(), report.explain()


OWN_QUEUE = """
resource ownQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: 'own-queue'
  properties: {
    requiresDuplicateDetection: false
    lockDuration: 'PT5M'
    maxDeliveryCount: 5000
    defaultMessageTimeToLive: messageTimeToLive
    deadLetteringOnMessageExpiration: true
  }
}
"""


def test_an_apps_own_queue_declared_badly_is_refused_by_its_name(tmp_path: Path) -> None:
    """A queue of the app's own, declared beside the template's without duplicate detection nor
    a receive role, with 5000 deliveries of 5 minutes: every check refuses it, naming it."""
    copy = infra_copy(tmp_path)
    (copy / "modules/servicebus.bicep").write_text((copy / "modules/servicebus.bicep").read_text() + OWN_QUEUE)
    violations = policy_violations(copy)
    assert "ownQueue[own-queue]: duplicate detection off" in violations
    assert "ownQueue[own-queue]: no detection window" in violations
    assert "queue 'own-queue': the app has no receive role on it (roles.bicep)" in violations
    place = "modules/servicebus.bicep:ownQueue[own-queue]"
    assert [f.split(" ")[0] for f in retention_check(copy, HOST).failures] == [place]
    leases = lease_check(copy, HOST).failures
    assert f"{place}: maxDeliveryCount 5000 == DEDUP_MAX_DELIVERY_COUNT 10" in leases, leases
    done = subprocess.run([sys.executable, "-m", "lab.infra_checks", "policies", str(copy)], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and "POLICY ownQueue[own-queue]: duplicate detection off" in done.stdout


def test_a_receive_role_on_an_entity_infra_does_not_deploy_is_refused(tmp_path: Path) -> None:
    """The roles module given a queue the Service Bus module does not declare (a stale name)."""
    copy = infra_copy(tmp_path, edits=(("main.bicep", "receiveQueues: concat(queues, ",
                                        "receiveQueues: concat(queues, ['ghost'], "),))  # fmt: skip
    assert "queue 'ghost': a receive role, but infra does not deploy it" in policy_violations(copy)


def app_setting(line: str) -> tuple[str, str, str]:
    """An edit of main.bicep that adds one app setting."""
    anchor = "DEDUP_RETENTION: 'P${dedupRetentionDays}D'"
    return ("main.bicep", anchor, f"{anchor}\n  {line}")


@pytest.mark.parametrize(
    ("change", "edits", "expected"),
    [
        ({"maxDeliveryCount": 1}, (), "0 later deliveries cover"),  # too few deliveries for the lease
        ({}, (app_setting("DEDUP_LEASE: 'PT20M'"),), "later deliveries cover"),  # outlives 9 waits of 2 min
        ({}, (app_setting("DEDUP_TRANSIENT_WAIT: 'PT4M'"),), "functionTimeout"),  # waits past the function's end
        ({}, (("main.bicep", "'${maxDeliveryCount}'", "'7'"),), "== DEDUP_MAX_DELIVERY_COUNT"),  # out of step
        ({}, (app_setting("DEDUP_IN_FLIGHT_WAIT: 'PT25S'"),), "Event Grid within"),  # Event Grid stops listening
        ({}, (app_setting("DEDUP_LEASE: 'PT15S'"),), "call timeout"),  # a live call may outlive the lease
        ({}, (app_setting("DEDUP_OUTBOX_SWEEP_DELAY: 'PT4M'"),), "never races a call"),  # the sweep could send first
    ],
)
def test_a_lease_that_outlives_the_redeliveries_fails(
    tmp_path: Path, change: dict[str, object], edits: tuple[tuple[str, str, str], ...], expected: str
) -> None:
    report = lease_check(infra_copy(tmp_path, change, edits), HOST)
    assert not report.ok and any(expected in failure for failure in report.failures), report.explain()


@pytest.mark.parametrize(("change", "edits", "wait"), [
    ({}, (), None),  # as configured: maxDeliveryCount x DEDUP_TRANSIENT_WAIT, back to back
    ({"maxDeliveryCount": 5}, (), None),
    ({}, (app_setting("DEDUP_TRANSIENT_WAIT: 'PT30S'"),), timedelta(seconds=30)),
])  # fmt: skip
def test_the_lease_check_states_the_longest_outage_survived(
    tmp_path: Path, change: dict[str, object], edits: tuple[tuple[str, str, str], ...], wait: timedelta | None
) -> None:
    copy = infra_copy(tmp_path, change, edits)
    deliveries = int(parameter_values(copy)["maxDeliveryCount"])
    outage = deliveries * (wait or isodate.parse_duration(app_settings(copy)("DEDUP_TRANSIENT_WAIT", "PT2M")))
    report = lease_check(copy, HOST)
    assert report.ok and f"a store outage of up to {outage} is survived" in report.explain()


def test_host_timespans() -> None:
    assert timespan("00:05:00") == timedelta(minutes=5)
    assert timespan("1.02:00:30") == timedelta(days=1, hours=2, seconds=30)


def test_the_check_retention_command_fails_on_bad_parameters(tmp_path: Path) -> None:
    broken = tmp_path / "infra"
    shutil.copytree(INFRA, broken)
    parameters = json.loads((broken / "main.parameters.json").read_text())
    parameters["parameters"]["dedupRetentionDays"]["value"] = 3
    (broken / "main.parameters.json").write_text(json.dumps(parameters))
    result = subprocess.run([sys.executable, "-m", "lab.delivery_checks", "retention", str(broken)],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1 and "FAIL" in result.stdout


def test_the_check_retention_command_judges_main_bicep_defaults_too(tmp_path: Path) -> None:
    """``az deployment group create`` (as docs/operations.md runs it) takes main.bicep's defaults,
    not azd's parameters file: a short default fails the check, saying which deployment."""
    broken = tmp_path / "infra"
    shutil.copytree(INFRA, broken)
    bicep = broken / "main.bicep"
    bicep.write_text(bicep.read_text().replace("param dedupRetentionDays int = 30", "param dedupRetentionDays int = 5"))
    result = subprocess.run([sys.executable, "-m", "lab.delivery_checks", "retention", str(broken)],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    azd, defaults = result.stdout.split("as az deployment group create deploys it")
    assert result.returncode == 1 and "FAIL" not in azd and "FAIL" in defaults, result.stdout


def test_every_event_grid_subscription_delivers_to_a_function_of_the_app() -> None:
    """Whatever infra deploys: each subscription's ``functionName`` names one of the app's
    functions (a renamed function would leave its subscription delivering nowhere)."""
    import consumers

    names = {builder._function.get_function_name() for blueprint in consumers.blueprints()
             for builder in blueprint._function_builders}  # fmt: skip
    subscribed = subscribed_functions(INFRA, [])
    assert all(name in names for name in subscribed.values()), (subscribed, sorted(names))
    called = "'modules/eventgrid-subscription.bicep'" in (INFRA / "main.bicep").read_text()
    assert bool(subscribed) == called  # each subscription main.bicep calls is found


def test_a_subscription_to_a_function_the_app_lacks_is_found(tmp_path: Path) -> None:
    """The rule above can fail: a subscription added to whatever main.bicep deploys, naming a
    function no blueprint has, is among the subscriptions it reads."""
    broken = tmp_path / "infra"
    shutil.copytree(INFRA, broken)
    bicep = broken / "main.bicep"
    bicep.write_text(
        bicep.read_text()
        + """
module strayedSubscription 'modules/eventgrid-subscription.bicep' = {
  name: 'strayed-subscription'
  params: {
    name: 'strayed'
    eventTypes: ['com.example.strayed']
    topicName: 'topic'
    functionAppName: 'app'
    functionName: 'no_such_function'
    storageAccountName: 'storage'
    deadLetterContainer: 'dead-letters'
  }
}
"""
    )
    assert subscribed_functions(broken, []).get("strayedSubscription") == "no_such_function"


# -- only where the tools exist ----------------------------------------------------------


@pytest.mark.skipif(shutil.which("bicep") is None, reason="the Bicep CLI is not installed (it downloads its binary)")
def test_the_templates_compile_with_the_bicep_cli() -> None:
    result = subprocess.run(["bicep", "build", str(INFRA / "main.bicep"), "--stdout"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(
    shutil.which("az") is None or not os.environ.get("AZURE_RESOURCE_GROUP"),
    reason="what-if needs the Azure CLI, a login and AZURE_RESOURCE_GROUP",
)
def test_what_if_against_a_resource_group() -> None:
    result = subprocess.run(
        ["az", "deployment", "group", "what-if", "-g", os.environ["AZURE_RESOURCE_GROUP"], "-f",
         str(INFRA / "main.bicep"), "-p", "environmentName=whatif"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_dead_letter_records_must_outlive_the_resubmission_margin(tmp_path: Path) -> None:
    kept = (
        "main.bicep",
        "DEDUP_DEAD_LETTER_RETENTION: 'P${deadLetterResubmitDays}D'",
        "DEDUP_DEAD_LETTER_RETENTION: 'P3D'",
    )
    report = retention_check(infra_copy(tmp_path, edits=(kept,)), HOST)
    assert [failure.split(" (")[0] for failure in report.failures] == [
        "dead-letter records kept 3.00 days >= resubmission margin"
    ]


def test_every_checkov_skip_says_why() -> None:
    """`make scan-infra` passes with skips; each one carries its reason beside the resource."""
    skips = [(path.name, line.strip()) for path in INFRA.rglob("*.bicep") for line in path.read_text().splitlines()
             if "checkov:skip" in line]  # fmt: skip
    assert len(skips) >= 10
    for file, line in skips:
        found = re.fullmatch(r"// checkov:skip=(CKV_AZURE_\d+): (.{20,})", line)
        assert found, f"{file}: {line!r} has no reason"


def test_the_telemetry_setup_agrees_across_host_json_app_settings_and_code() -> None:
    """Microsoft's OpenTelemetry setup for Python Functions: telemetryMode in host.json, the
    worker's flags and Entra ID ingestion in the app settings, the distro in the packages;
    the app configures it only where the worker could not (tests/runtime proves both)."""
    root = INFRA.parent
    assert json.loads((root / "host.json").read_text())["telemetryMode"] == "OpenTelemetry"
    app = (INFRA / "modules" / "functionapp.bicep").read_text()
    for flag in (
        "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY: 'true'",
        "PYTHON_ENABLE_OPENTELEMETRY: 'true'",
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'",
    ):
        assert flag in app, flag
    assert re.search(r"^azure-monitor-opentelemetry==", (root / "requirements.txt").read_text(), re.MULTILINE)
    code = (root / "function_app.py").read_text()
    assert code.count("configure_azure_monitor(") == 1 and "ProxyTracerProvider" in code


def test_every_azd_hook_runs_a_script_of_the_repository() -> None:
    """azure.yaml names its hooks' scripts by path: a moved script fails only after `azd deploy`."""
    runs = re.findall(r"^\s*run:\s*(\S+)\s*$", (ROOT / "azure.yaml").read_text(), re.MULTILINE)
    assert runs
    for run in runs:
        assert (ROOT / run).is_file(), f"azure.yaml runs {run}, which is not in the repository"


def test_the_hooks_read_only_what_main_bicep_outputs_and_subscribe_a_blob_trigger_of_the_app() -> None:
    """The postdeploy hooks read main.bicep's outputs (and their own switch); the webhook they
    subscribe is the one of a blob trigger with the Event Grid source, in consumers/ or recipes/
    (without recipes/, after make remove-example, the recipe that needs it cannot be on)."""
    outputs = set(re.findall(r"^output (\w+) ", (INFRA / "main.bicep").read_text(), re.MULTILINE))
    for hook in sorted((INFRA / "hooks").iterdir()):
        text = hook.read_text()
        assert set(re.findall(r"azd env get-value (\w+)", text)) - {"DEPLOY_EVENT_SUBSCRIPTION"} <= outputs, hook.name
        functions = set(re.findall(r"functionName=Host\.Functions\.(\w+)", text))
        for name in functions if (ROOT / "recipes").is_dir() else ():
            sources = [*ROOT.glob("consumers/*.py"), *ROOT.glob("recipes/*.py")]
            trigger = (
                rf"@bp\.function_name\(\"{name}\"\)\s*\n@bp\.blob_trigger\([^@]*source=func\.BlobSource\.EVENT_GRID"
            )
            declared = [p for p in sources if re.search(trigger, p.read_text())]
            assert declared, f"{hook.name} subscribes {name}, which is no blob trigger with the Event Grid source"


def test_a_storage_queue_gets_its_outage_budget_and_its_dequeues_must_outlast_a_lease(tmp_path: Path) -> None:
    """host.json's extensions.queues, read for every Storage queue infra deploys: the outage a
    message survives before its poison queue is stated; too few dequeues for a crashed owner's
    claim to lapse fail, by each queue's name; a poison queue is no place of its own."""
    copy = infra_copy(tmp_path, recipes=["queue"])
    queues = HOST["extensions"]["queues"]
    wait = isodate.parse_duration(app_settings(copy)("DEDUP_TRANSIENT_WAIT", "PT2M"))
    outage = queues["maxDequeueCount"] * (wait + timespan(queues["visibilityTimeout"]))
    names = [p.name for p in redeliveries(copy, host=HOST) if p.broker == "storage queue"]
    assert "modules/storage-queues.bicep:consumed[returns]" in names and not [n for n in names if "-poison" in n]
    report = lease_check(copy, HOST)
    for name in names:
        assert f"{name}: a store outage of up to {outage} is survived before its poison queue" in report.explain()
    assert report.ok, report.explain()
    once = {**HOST, "extensions": {**HOST["extensions"], "queues": {**queues, "maxDequeueCount": 1}}}
    failed = lease_check(copy, once)
    assert [f.split(" ")[0] for f in failed.failures] == [f"{name}:" for name in names], failed.explain()


def test_the_account_wide_queue_role_comes_with_a_blob_trigger_only(tmp_path: Path) -> None:
    """Storage Queue Data Contributor on the whole account is the host's, for a blob trigger's
    queues: with the blob-import recipe; given without it, the policies refuse it."""
    symbols = {r.symbol for r in Deployment(INFRA, []).resources} | {r.symbol for r in Deployment(INFRA, ALL).resources}
    assert "queueContributor" in symbols and "queueContributor" not in {
        r.symbol for r in Deployment(INFRA, []).resources
    }
    assert policy_violations(INFRA, []) == []
    copy = infra_copy(tmp_path, edits=(("main.bicep", "blobTrigger: withBlobImport", "blobTrigger: true"),),
                      recipes=[])  # fmt: skip
    assert policy_violations(copy, []) == ["queueContributor: Storage Queue Data Contributor without a blob trigger"]


@pytest.mark.parametrize("recipes", [[], ALL], ids=["no-recipe", "all-recipes"])
def test_an_apps_own_storage_queue_gets_its_poison_queue_its_roles_and_the_checks(
    tmp_path: Path, recipes: list[str]
) -> None:
    """docs/triggers.md: a Storage queue of the app's own is one name in appStorageQueues; it is
    deployed with its poison queue, the roles on both and the poison-queue alert, and the checks
    read it by its name."""
    copy = infra_copy(tmp_path, recipes=recipes)
    jobs = with_app_entity(copy, "jobs", "appStorageQueues")
    deployment = Deployment(copy)
    _, roles = deployment.calls["roles"]
    _, alerts = deployment.calls["alerts"]
    assert jobs in roles("storageQueues"), f"the app has no roles on its own Storage queue {jobs!r}"
    assert "storage-poison-queue" in [rule["name"] for rule in alerts("logAlerts")], f"no alert on '{jobs}-poison'"
    queues = {r.symbol: r.count for r in deployment.resources if r.path == "modules/storage-queues.bicep"}
    assert queues["poison"] == queues["consumed"] == len(roles("storageQueues")), queues  # a poison queue each
    assert policy_violations(copy) == []
    own = f"modules/storage-queues.bicep:consumed[{jobs}]"
    assert [p.broker for p in redeliveries(copy, host=HOST) if p.name == own] == ["storage queue"]
    for report in (retention_check(copy, HOST), lease_check(copy, HOST)):
        assert report.ok and own in report.explain(), report.explain()
