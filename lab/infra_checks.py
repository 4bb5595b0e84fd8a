"""Checks on infra/ that need no Bicep compiler: the Bicep files are parsed (PyPI
``pycep-parser``) and the security policies asserted on the parsed tree of what is deployed
with the recipes named in infra/recipes.json (``Deployment``). (What the brokers may
redeliver, against the dedup settings, is lab/delivery_checks.py.)

    python -m lab.infra_checks policies [infra_dir]
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property, lru_cache, partial
from pathlib import Path
from typing import Any

from pycep import BicepParser

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
PYTHON_VERSIONS = ("3.12", "3.13")  # what the runtime suite proves (lab/pythons.py), deployable on Flex


def parse(path: Path) -> dict[str, Any]:
    """A Bicep file's tree, the caller's own to change (parsed once per content: the checks
    read each template many times; a pickled copy loads ten times faster than a deep copy)."""
    tree: dict[str, Any] = pickle.loads(_parsed(path.read_text()))
    return tree


@lru_cache(maxsize=256)
def _parsed(text: str) -> bytes:
    return pickle.dumps(dict(_parser().parse(text=text)))


@lru_cache(maxsize=1)
def _parser() -> BicepParser:
    return BicepParser()


def bicep_files(infra: Path) -> list[Path]:
    return sorted(infra.rglob("*.bicep"))


# -- parameters and host.json --------------------------------------------------------------


# Which deployment the parameter values are those of: azd's (main.parameters.json over main.bicep's
# defaults: True) or ``az deployment group create`` without a parameters file, as docs/operations.md
# runs it (main.bicep's defaults: False). The checks judge both (``as_deployed``).
WITH_PARAMETERS_FILE: ContextVar[bool] = ContextVar("with_parameters_file", default=True)


@contextmanager
def main_bicep_defaults() -> Iterator[None]:
    """While open, parameter values are main.bicep's defaults: what ``az deployment`` deploys."""
    token = WITH_PARAMETERS_FILE.set(False)
    try:
        yield
    finally:
        WITH_PARAMETERS_FILE.reset(token)


def parameter_values(infra: Path) -> dict[str, Any]:
    """Defaults from main.bicep, overridden by main.parameters.json (an azd
    ``${NAME=default}`` value counts as its default) — but inside ``main_bicep_defaults``."""
    values = {name: spec.get("default") for name, spec in parse(infra / "main.bicep")["parameters"].items()}
    parameters_file = infra / "main.parameters.json"
    if parameters_file.exists() and WITH_PARAMETERS_FILE.get():
        for name, spec in json.loads(parameters_file.read_text())["parameters"].items():
            value = spec.get("value")
            if isinstance(value, str) and (match := re.fullmatch(r"\$\{\w+(?:=(.*))?\}", value)):
                value = match.group(1) if match.group(1) is not None else values.get(name)
            values[name] = value
    return values


def timespan(text: str) -> timedelta:
    """host.json durations are .NET TimeSpans: ``[d.]hh:mm:ss``."""
    days, _, clock = text.partition(".") if "." in text.split(":")[0] else ("0", "", text)
    hours, minutes, seconds = clock.split(":")
    return timedelta(days=int(days), hours=int(hours), minutes=int(minutes), seconds=float(seconds))


# -- recipes and what they deploy ---------------------------------------------------------


class RecipeError(ValueError):
    """infra/recipes.json is not a list of the recipe names main.bicep allows."""


def allowed_values(bicep: Path, parameter: str) -> list[Any] | None:
    """The ``@allowed`` values of a parameter of a Bicep file (None: no such decorator)."""
    spec = parse(bicep)["parameters"].get(parameter, {})
    found = [d["argument"] for d in spec.get("decorators", []) if d.get("type") == "allowed"]
    return list(found[0]) if found else None


def allowed_recipes(infra: Path = INFRA) -> list[str]:
    """The recipe names main.bicep allows (the ``@allowed`` of its ``recipes`` parameter)."""
    allowed = allowed_values(infra / "main.bicep", "recipes")
    if allowed is None:
        raise RecipeError(f"{infra / 'main.bicep'}: no recipes parameter with its allowed names")
    return allowed


def read_recipes(infra: Path = INFRA) -> list[str]:
    """The recipes switched on: infra/recipes.json, a JSON array of allowed names."""
    path = infra / "recipes.json"
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{path}: {exc}") from exc
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise RecipeError(f"{path}: not a JSON array of recipe names: {names!r}")
    allowed = allowed_recipes(infra)
    if unknown := [name for name in names if name not in allowed]:
        raise RecipeError(f"{path}: unknown recipe {', '.join(map(repr, unknown))}; known: {', '.join(allowed)}")
    return names


class _Unknown:
    """A value only the deployment knows: a parameter (every value it may take counts), a
    resource's or module's property, a function this reader does not evaluate."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


def _args(function: dict[str, Any]) -> list[Any]:
    parameters = function.get("parameters") or {}
    return [parameters[k] for k in sorted(parameters, key=lambda k: int(k.rpartition("_")[2]))]


class Scope:
    """Evaluates the expressions of one template that decide what is deployed: conditions,
    loop arrays, the app settings' ``union``. Parameters are given (else UNKNOWN; a callable
    is evaluated once, when read), variables evaluated on demand; ``module.outputs.name`` is
    read through ``modules`` (main.bicep's calls), ``resource.name`` from its declaration and
    ``resource.id`` is a placeholder (never empty). pycep gives identifiers and string literals
    alike: a name in scope is a parameter or variable. Conditions are written as plain names,
    ``!empty(name)`` or parenthesised, because pycep binds ``? :`` tighter than ``&&`` or ``==``."""

    def __init__(self, tree: dict[str, Any], params: dict[str, Any],
                 modules: Callable[[str], Scope | None] | None = None) -> None:  # fmt: skip
        self.tree = tree
        self.params = params
        self.modules = modules or (lambda call: None)
        self.variables = {name: spec.get("value") for name, spec in tree.get("variables", {}).items()}
        self._values: dict[str, Any] = {}

    def _named(self, name: str, node: Any) -> Any:
        if name not in self._values:
            self._values[name] = UNKNOWN  # a cycle reads as unknown
            self._values[name] = node() if callable(node) else self(node)
        return self._values[name]

    def _property(self, node: Any) -> Any:
        path: list[Any] = []
        while isinstance(node, dict) and node.get("operator", {}).get("type") == "property_accessor":
            path.append(node["operator"]["operands"]["operand_1"])
            node = node["operator"]["operands"]["operand_2"]
        path.append(node)
        if not all(isinstance(part, str) for part in path):
            return UNKNOWN
        resources = self.tree.get("resources", {})
        if len(path) == 3 and path[1] == "outputs" and (module := self.modules(path[0])) is not None:
            output = module.tree.get("outputs", {}).get(path[2])
            return module(output["value"]) if output else UNKNOWN
        if len(path) == 2 and path[0] in resources and path[1] in ("name", "id"):
            name = self(body(resources[path[0]]).get("name")) if path[1] == "name" else UNKNOWN
            return name if isinstance(name, str) else f"<{path[0]}.{path[1]}>"
        return UNKNOWN

    def __call__(self, node: Any) -> Any:
        if isinstance(node, str):
            if node in self.params:
                return self._named(node, self.params[node]) if callable(self.params[node]) else self.params[node]
            if node in self.variables:
                return self._named(node, self.variables[node])
            return UNKNOWN if "${" in node else node
        if isinstance(node, list):
            return [self(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "operator" in node:
            kind, operands = node["operator"]["type"], node["operator"].get("operands") or {}
            if kind == "property_accessor":
                return self._property(node)
            if kind == "not":
                value = self(operands["bool_value"])
                return UNKNOWN if value is UNKNOWN else not value
            if kind in ("and", "or"):
                sides = [self(operands["operand_1"]), self(operands["operand_2"])]
                decisive = kind == "or"  # True decides an or, False an and, whatever the other side
                if any(side is not UNKNOWN and bool(side) == decisive for side in sides):
                    return decisive
                return UNKNOWN if any(side is UNKNOWN for side in sides) else not decisive
            if kind == "conditional":
                condition = self(operands["condition"])
                if condition is UNKNOWN:
                    return UNKNOWN
                return self(operands["true_value"] if condition else operands["false_value"])
            if kind in ("equals", "not_equals"):
                left, right = self(operands["operand_1"]), self(operands["operand_2"])
                if left is UNKNOWN or right is UNKNOWN:
                    return UNKNOWN
                return (left == right) == (kind == "equals")
            return UNKNOWN
        if "function" in node:
            function = node["function"]
            kind, parameters = function["type"], function.get("parameters") or {}
            if kind == "contains":
                container, item = self(parameters["container"]), self(parameters["item_to_find"])
                if item is UNKNOWN or not isinstance(container, (list, str)):
                    return UNKNOWN
                if item in container:
                    return True
                return UNKNOWN if any(element is UNKNOWN for element in container) else False
            if kind == "empty":
                value = self(parameters["item_to_test"])
                return len(value) == 0 if isinstance(value, (str, list, dict)) else UNKNOWN
            if kind in ("concat", "union"):
                values = [self(arg) for arg in _args(function)]
                if all(isinstance(value, list) for value in values):
                    items = [item for value in values for item in value]
                    return items if kind == "concat" else [x for i, x in enumerate(items) if x not in items[:i]]
                if kind == "union" and all(isinstance(value, dict) for value in values):
                    return {key: item for value in values for key, item in value.items()}
            return UNKNOWN
        if "loop_type" in node:
            return UNKNOWN
        return node  # an object literal: its values stay as parsed


@dataclass(frozen=True)
class Resource:
    file: str  # the template's file name
    symbol: str
    type: str
    config: dict[str, Any]  # the declaration's body (inside its condition and loop)
    call: str = ""  # the module call of main.bicep that deploys it ("" in main.bicep itself)
    path: str = "main.bicep"  # the template, relative to infra/
    count: int | None = 1  # the entities a ``[for ...]`` declares (None: known at deployment only)
    existing: bool = False
    names: tuple[str, ...] = ()  # the entities' names, where the templates fix them (a loop: each one's)

    @property
    def properties(self) -> dict[str, Any]:
        return self.config.get("properties") or {}

    @property
    def entities(self) -> list[str]:
        """One label per entity: ``symbol[name]``, the symbol alone where it is the name or the
        names are known at deployment only (a loop over a parameter: one label for all)."""
        return [self.symbol if n == self.symbol else f"{self.symbol}[{n}]" for n in self.names] or [self.symbol]


def is_poison(resource: Resource) -> bool:
    """A Storage poison queue (``<queue>-poison``): the host moves messages there, nobody consumes them."""
    return any(str(name).endswith("-poison") for name in (*resource.names, resource.config.get("name", "")))


def blob_triggered(infra: Path = INFRA, recipes: Sequence[str] | None = None) -> bool:
    """Whether infra/ deploys a storage account's system topic: the blob trigger's events."""
    return any(r.type == SYSTEM_TOPIC_TYPE and not r.existing for r in Deployment(infra, recipes).resources)


def body(spec: dict[str, Any]) -> dict[str, Any]:
    """A declaration's body, inside its ``if (...)`` and ``[for ...]`` wrappers."""
    config: dict[str, Any] = spec.get("config") or {}
    while "condition" in config or "loop_type" in config:
        config = config["config"]
    return config


class Deployment:
    """What main.bicep deploys with the recipes of infra/recipes.json (or those given): the
    module calls and resources whose condition holds. The recipes are the one input fixed
    here; a condition on another parameter (vnetEnabled, dedupStore, deployEventSubscription,
    an optional principal) counts as met, so the checks cover every value it may take, unless
    ``parameters`` fixes it."""

    def __init__(self, infra: Path = INFRA, recipes: Sequence[str] | None = None,
                 parameters: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.infra = infra
        self.recipes = read_recipes(infra) if recipes is None else list(recipes)
        self.main = parse(infra / "main.bicep")
        params = {name: UNKNOWN for name in self.main.get("parameters", {})}
        self.scope = Scope(self.main, {**params, **(parameters or {}), "recipes": self.recipes}, self.module)
        self._modules: dict[str, Scope | None] = {}

    def deployed(self, spec: dict[str, Any], scope: Scope) -> tuple[bool, int | None]:
        """Whether a declaration is deployed, and how many entities it declares."""
        config = spec.get("config") or {}
        count: int | None = 1
        while "condition" in config or "loop_type" in config:
            if config.get("condition") is not None and scope(config["condition"]) is False:
                return False, 0
            if loop := (config.get("loop_type") or {}).get("detail"):
                items = scope(loop["array_name"])
                count = len(items) if isinstance(items, list) else None
                if count == 0:
                    return False, 0
            config = config["config"]
        return True, count

    def module(self, call: str) -> Scope | None:
        """The scope of main.bicep's module call ``call`` if it is deployed (its parameters
        evaluated when read), else None."""
        if call not in self._modules:
            module = self.main.get("modules", {}).get(call)
            if not module or module.get("type") != "local" or not self.deployed(module, self.scope)[0]:
                self._modules[call] = None
            else:
                tree = parse(self.infra / module["detail"]["path"])
                passed = body(module).get("params") or {}
                params = {name: partial(self.scope, passed[name]) if name in passed else _literal(spec.get("default"))
                          for name, spec in tree.get("parameters", {}).items()}  # fmt: skip
                self._modules[call] = Scope(tree, params)
        return self._modules[call]

    @cached_property
    def calls(self) -> dict[str, tuple[str, Scope]]:
        """The module calls deployed: symbol -> (template path, the module's scope)."""
        return {call: (module["detail"]["path"], scope) for call, module in self.main.get("modules", {}).items()
                if (scope := self.module(call)) is not None}  # fmt: skip

    @cached_property
    def resources(self) -> list[Resource]:
        """Every resource deployed (``existing`` ones too, flagged), in main.bicep then per call."""
        templates = [("", "main.bicep", self.scope)]
        templates += [(call, path, scope) for call, (path, scope) in self.calls.items()]
        found = []
        for call, path, scope in templates:
            for symbol, spec in scope.tree.get("resources", {}).items():
                deployed, count = self.deployed(spec, scope)
                if deployed:
                    found.append(Resource(Path(path).name, symbol, spec["type"], body(spec), call, path, count,
                                          bool(spec.get("existing")), _names(spec, scope)))  # fmt: skip
        return found

    def app_settings(self) -> dict[str, Any]:
        """The function app's settings deployed (values as parsed): main.bicep's ``union`` of
        the default app's settings and each recipe's, evaluated."""
        if "functionApp" not in self.calls:
            return {}
        settings = self.scope((body(self.main["modules"]["functionApp"]).get("params") or {}).get("appSettings"))
        if not isinstance(settings, dict):
            raise ValueError(f"{self.infra / 'main.bicep'}: cannot read the function app's appSettings: {settings!r}")
        return settings


def subscribed_functions(infra: Path = INFRA, recipes: Sequence[str] | None = None) -> dict[str, Any]:
    """The function each Event Grid subscription deployed delivers to: module call -> the
    ``functionName`` its eventgrid-subscription.bicep call passes."""
    deployment = Deployment(infra, recipes)
    return {call: scope("functionName") for call, (path, scope) in deployment.calls.items()
            if Path(path).name == "eventgrid-subscription.bicep"}  # fmt: skip


def _names(spec: dict[str, Any], scope: Scope) -> tuple[str, ...]:
    """The names of the entities a declaration deploys, when they are known before deployment:
    its ``name``, or in a ``[for item in array]`` whose name is the item, the array's strings."""
    config, item, items = spec.get("config") or {}, None, None
    while "condition" in config or "loop_type" in config:
        if loop := (config.get("loop_type") or {}).get("detail"):
            item, items = loop.get("item_name"), scope(loop["array_name"])
        config = config["config"]
    if item is None:
        name = scope(config.get("name"))
        return (name,) if isinstance(name, str) and not name.startswith("<") else ()  # not a placeholder
    if config.get("name") == item and isinstance(items, list) and all(isinstance(i, str) for i in items):
        return tuple(items)
    return ()


def _literal(value: Any) -> Any:
    """A module parameter's default, when it is a plain value."""
    return value if isinstance(value, (bool, int, float, list)) or (
        isinstance(value, str) and "${" not in value) else UNKNOWN  # fmt: skip


def _text(value: Any) -> str:
    return json.dumps(value, default=str)


SECRET_PATTERNS = re.compile(r"listKeys|listConnectionStrings|AccountKey=|SharedAccessKey|primaryKey|masterKey")


# The operator (smoke test) may reach single entities only: never a namespace or an account.
SENDER_SCOPES = frozenset({"Microsoft.ServiceBus/namespaces/topics", "Microsoft.ServiceBus/namespaces/queues"})
SUBSCRIPTION_TYPE = "Microsoft.ServiceBus/namespaces/topics/subscriptions"
RECEIVER_SCOPES = frozenset({"Microsoft.ServiceBus/namespaces/queues", SUBSCRIPTION_TYPE})
STORAGE_QUEUE_TYPE = "Microsoft.Storage/storageAccounts/queueServices/queues"
SYSTEM_TOPIC_TYPE = "Microsoft.EventGrid/systemTopics"  # a storage account's: the blob trigger's events
STORAGE_QUEUE_ROLES = ("storageQueueDataReader", "storageQueueDataMessageProcessor", "storageQueueDataMessageSender")
OPERATOR_SCOPES = frozenset({
    "Microsoft.ServiceBus/namespaces/queues",
    "Microsoft.EventGrid/topics",
    "Microsoft.Storage/storageAccounts/tableServices/tables",
})  # fmt: skip


def policy_violations(infra: Path = INFRA, recipes: Sequence[str] | None = None) -> list[str]:
    """The policies broken by what infra/ deploys with ``recipes`` (default: infra/recipes.json)."""
    try:
        deployment = Deployment(infra, recipes)
    except RecipeError as exc:
        return [str(exc)]
    found: list[str] = []
    main = deployment.main
    declared = {(r.file, r.symbol): r for r in deployment.resources if not r.existing}  # a module called twice: once
    all_resources = list(declared.values())

    def by_type(type_: str) -> list[Resource]:
        return [r for r in all_resources if r.type == type_]

    def require(condition: bool, message: str) -> None:
        if not condition:
            found.append(message)

    for path in bicep_files(infra):
        for match in SECRET_PATTERNS.finditer(path.read_text()):
            found.append(f"{path.name}: secret material {match.group(0)!r}: use managed identity")

    namespaces = by_type("Microsoft.ServiceBus/namespaces")
    require(bool(namespaces), "no Service Bus namespace")
    for ns in namespaces:
        tiers = set(re.findall(r'"name": "(\w+)"', _text(ns.config.get("sku"))))  # vnetEnabled: a choice
        require(bool(tiers) and tiers <= {"Standard", "Premium"},
                f"{ns.symbol}: tier must be Standard or Premium (Basic: no detection)")  # fmt: skip
        require(ns.properties.get("disableLocalAuth") is True, f"{ns.symbol}: Service Bus local (SAS) auth enabled")
    private = ("Microsoft.Storage/storageAccounts", "Microsoft.ServiceBus/namespaces", "Microsoft.EventHub/namespaces",
               "Microsoft.DocumentDB/databaseAccounts")  # fmt: skip
    for plane in (r for kind in private for r in by_type(kind)):  # vnetEnabled turns public access off
        access = plane.properties.get("networkAcls" if "Storage" in plane.type else "publicNetworkAccess")
        require("privateOnly" in _text(access), f"{plane.symbol}: public network access not tied to vnetEnabled")
    for ns in by_type("Microsoft.EventHub/namespaces"):
        require(ns.properties.get("disableLocalAuth") is True, f"{ns.symbol}: Event Hubs local (SAS) auth enabled")
    queues = by_type("Microsoft.ServiceBus/namespaces/queues")
    require(bool(queues), "no Service Bus queue")
    for declared_entities in queues + by_type("Microsoft.ServiceBus/namespaces/topics"):
        for entity in declared_entities.entities:
            require(declared_entities.properties.get("requiresDuplicateDetection") is True,
                    f"{entity}: duplicate detection off")  # fmt: skip
            require("duplicateDetectionHistoryTimeWindow" in declared_entities.properties,
                    f"{entity}: no detection window")  # fmt: skip
    for declared_entities in queues + by_type(SUBSCRIPTION_TYPE):
        for entity in declared_entities.entities:
            require(declared_entities.properties.get("deadLetteringOnMessageExpiration") is True,
                    f"{entity}: expired messages are dropped, not dead-lettered")  # fmt: skip

    for account in by_type("Microsoft.Storage/storageAccounts"):
        require(account.properties.get("allowSharedKeyAccess") is False, f"{account.symbol}: shared keys allowed")
        require(account.properties.get("allowBlobPublicAccess") is False, f"{account.symbol}: public blob access")
        require(account.properties.get("minimumTlsVersion") == "TLS1_2", f"{account.symbol}: TLS below 1.2")
    for account in by_type("Microsoft.DocumentDB/databaseAccounts"):
        require(account.properties.get("disableLocalAuth") is True, f"{account.symbol}: Cosmos DB keys enabled")
    for workspace in by_type("Microsoft.OperationalInsights/workspaces"):
        require(workspace.properties.get("features", {}).get("disableLocalAuth") is True,
                f"{workspace.symbol}: Log Analytics local auth")  # fmt: skip
    for component in by_type("Microsoft.Insights/components"):
        require(component.properties.get("DisableLocalAuth") is True, f"{component.symbol}: App Insights local auth")
    topics = by_type("Microsoft.EventGrid/topics")
    require(bool(topics), "no Event Grid topic")
    for topic in topics:
        require(topic.properties.get("inputSchema") == "CloudEventSchemaV1_0", f"{topic.symbol}: not CloudEvents 1.0")
        require(topic.properties.get("disableLocalAuth") is True, f"{topic.symbol}: Event Grid access keys enabled")
    for sub in by_type("Microsoft.EventGrid/topics/eventSubscriptions"):
        require(sub.properties.get("eventDeliverySchema") == "CloudEventSchemaV1_0", f"{sub.symbol}: not CloudEvents")
        require(sub.properties.get("destination", {}).get("endpointType") == "AzureFunction",
                f"{sub.symbol}: not delivered to the function")  # fmt: skip
        require("retryPolicy" in sub.properties, f"{sub.symbol}: no retry policy")
        require("deadLetterWithResourceIdentity" in sub.properties, f"{sub.symbol}: no dead-lettering")
        require("dedup.canary" in _text(sub.properties.get("filter")),
                f"{sub.symbol}: the canary's event type (dedup.canary) is filtered out")  # fmt: skip

    types = {(path.name, symbol): spec["type"] for path in bicep_files(infra)  # declared or existing
             for symbol, spec in parse(path).get("resources", {}).items()}  # fmt: skip
    for assignment in by_type("Microsoft.Authorization/roleAssignments"):
        scope = _scope_symbol(assignment.config.get("scope"))
        require(scope is not None, f"{assignment.file}:{assignment.symbol}: role assignment not scoped to a resource")
        if "eventGridPrincipalId" in _text(assignment.properties.get("principalId")):  # dead letters only
            container = (
                types.get((assignment.file, str(scope))) == "Microsoft.Storage/storageAccounts/blobServices/containers"
            )
            require(container, f"{assignment.symbol}: Event Grid's identity reaches beyond its dead-letter container")
        if "eventHubsDataReceiver" in _text(assignment.properties.get("roleDefinitionId")):  # the stream
            hub = types.get((assignment.file, str(scope))) == "Microsoft.EventHub/namespaces/eventhubs"
            require(hub, f"{assignment.symbol}: receives beyond one hub")
        if "serviceBusDataSender" in _text(assignment.properties.get("roleDefinitionId")):  # the outbox, an operator
            target = types.get((assignment.file, str(scope)))
            require(target in SENDER_SCOPES, f"{assignment.symbol}: Service Bus Data Sender beyond one entity")
        if "serviceBusDataReceiver" in _text(assignment.properties.get("roleDefinitionId")):  # each queue consumed
            target = types.get((assignment.file, str(scope)))
            require(target in RECEIVER_SCOPES, f"{assignment.symbol}: receives beyond one queue or subscription")
        role = _text(assignment.properties.get("roleDefinitionId"))
        if any(name in role for name in STORAGE_QUEUE_ROLES):  # a queue trigger's: on its queue
            target = types.get((assignment.file, str(scope)))
            require(target == STORAGE_QUEUE_TYPE, f"{assignment.symbol}: a Storage queue role beyond one queue")
        if "storageQueueDataContributor" in role:  # the host's blob-trigger queues: with a blob trigger only
            require(any(r.type == SYSTEM_TOPIC_TYPE for r in all_resources),
                    f"{assignment.symbol}: Storage Queue Data Contributor without a blob trigger")  # fmt: skip
        if "operatorPrincipalId" in _text(assignment.properties.get("principalId")):  # the smoke test's entities
            target = types.get((assignment.file, str(scope)))
            require(target in OPERATOR_SCOPES, f"{assignment.symbol}: the operator's role reaches beyond one entity")
    # Each Service Bus queue and subscription deployed (whose name is known before deployment) is
    # received by the app through a role on that entity, a consumer's own queue too; and none is
    # on an entity that infra does not deploy. The app's roles are those given its principalId.
    scopes = {(r.file, r.symbol): r for r in deployment.resources}
    received: set[tuple[str, str]] = set()
    for assignment in by_type("Microsoft.Authorization/roleAssignments"):
        if ("serviceBusDataReceiver" in _text(assignment.properties.get("roleDefinitionId"))
                and assignment.properties.get("principalId") == "principalId"):  # fmt: skip
            scoped = scopes.get((assignment.file, str(_scope_symbol(assignment.config.get("scope")))))
            received |= {(scoped.type, name) for name in scoped.names} if scoped else set()
    entities = {(r.type, name) for r in queues + by_type(SUBSCRIPTION_TYPE) for name in r.names}
    for kind, name in sorted(entities - received):
        found.append(f"{kind.rsplit('/', 1)[1][:-1]} {name!r}: the app has no receive role on it (roles.bicep)")
    for kind, name in sorted(received - entities):
        found.append(f"{kind.rsplit('/', 1)[1][:-1]} {name!r}: a receive role, but infra does not deploy it")
    # The canary timer sends through each queue the app receives from, and each topic whose
    # subscriptions it receives from: a Data Sender role of the app on each of those entities.
    sent: set[str] = set()
    for assignment in by_type("Microsoft.Authorization/roleAssignments"):
        if ("serviceBusDataSender" in _text(assignment.properties.get("roleDefinitionId"))
                and assignment.properties.get("principalId") == "principalId"):  # fmt: skip
            scoped = scopes.get((assignment.file, str(_scope_symbol(assignment.config.get("scope")))))
            sent |= set(scoped.names) if scoped else set()
    topics_read = {r.config.get("parent") for r in by_type(SUBSCRIPTION_TYPE)}
    for kind, name in sorted(received):
        through = name if kind.endswith("/queues") else next(
            (n for t in by_type("Microsoft.ServiceBus/namespaces/topics") if t.symbol in topics_read for n in t.names),
            name)  # fmt: skip
        require(through in sent, f"{kind.rsplit('/', 1)[1][:-1]} {name!r}: the canary cannot be sent through it "
                "(no Data Sender role of the app on it, roles.bicep)")  # fmt: skip
    # Each Storage queue consumed (not a <queue>-poison) is processed through a role on that queue.
    processed = {name for assignment in by_type("Microsoft.Authorization/roleAssignments")
                 if "storageQueueDataMessageProcessor" in _text(assignment.properties.get("roleDefinitionId"))
                 and (scoped := scopes.get((assignment.file, str(_scope_symbol(assignment.config.get("scope"))))))
                 for name in scoped.names}  # fmt: skip
    consumed = {name for r in by_type(STORAGE_QUEUE_TYPE) if not is_poison(r) for name in r.names}
    for name in sorted(consumed - processed):
        found.append(f"Storage queue {name!r}: the app has no processor role on it (roles.bicep)")
    for assignment in by_type("Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments"):
        require("/dbs/" in _text(assignment.properties.get("scope")),
                f"{assignment.symbol}: Cosmos role scoped beyond a database")  # fmt: skip

    publishing = {(p.config.get("parent"), p.config.get("name")): p.properties.get("allow")
                  for p in by_type("Microsoft.Web/sites/basicPublishingCredentialsPolicies")}  # fmt: skip
    for site in by_type("Microsoft.Web/sites"):
        require(site.config.get("identity", {}).get("type") == "UserAssigned", f"{site.symbol}: no managed identity")
        require(site.properties.get("httpsOnly") is True, f"{site.symbol}: plain HTTP accepted")
        for kind in ("ftp", "scm"):
            require(publishing.get((site.symbol, kind)) is False, f"{site.symbol}: {kind} basic publishing credentials")
        auth = [c for c in by_type("Microsoft.Web/sites/config")
                if c.config.get("parent") == site.symbol and c.config.get("name") == "authsettingsV2"]  # fmt: skip
        require(bool(auth), f"{site.symbol}: no Easy Auth option for the HTTP routes")
        for config in auth:
            validation = config.properties.get("globalValidation", {})
            require(validation.get("requireAuthentication") is True
                    and validation.get("unauthenticatedClientAction") == "Return401"
                    and validation.get("excludedPaths", []) == ["/runtime/webhooks/eventgrid"],
                    f"{site.symbol}: Easy Auth lets unauthenticated calls through")  # fmt: skip
        runtime = site.properties.get("functionAppConfig", {}).get("runtime", {})
        # a version, or the parameter whose allowed values are the proven versions (checked below)
        require(runtime.get("name") == "python" and runtime.get("version") in (*PYTHON_VERSIONS, "pythonVersion"),
                f"{site.symbol}: runtime is not Python {' or '.join(PYTHON_VERSIONS)}")  # fmt: skip
    app_params = body(main.get("modules", {}).get("functionApp", {})).get("params") or {}
    require(app_params.get("pythonVersion") == "pythonVersion",
            "main.bicep: the functionApp module is not given the pythonVersion parameter")  # fmt: skip
    for bicep in (infra / "main.bicep", infra / "modules" / "functionapp.bicep"):
        require(allowed_values(bicep, "pythonVersion") == list(PYTHON_VERSIONS),
                f"{bicep.name}: pythonVersion does not allow exactly Python {', '.join(PYTHON_VERSIONS)}")  # fmt: skip

    settings = deployment.app_settings()
    for name in settings:
        plain_connection = name in ("AzureWebJobsStorage", "ServiceBusConnection") or (
            "connectionstring" in name.lower() and name != "APPLICATIONINSIGHTS_CONNECTION_STRING"
        )
        require(not plain_connection, f"app setting {name}: a connection string; use identity-based settings")
    require("ServiceBusConnection__fullyQualifiedNamespace" in settings, "the trigger does not use managed identity")
    require("dedupRetentionDays" in _text(settings.get("DEDUP_RETENTION")), "DEDUP_RETENTION not from the parameter")
    cosmos = body(main.get("modules", {}).get("cosmos", {})).get("params", {})
    require("dedupRetentionDays" in _text(cosmos.get("defaultTtlSeconds")), "Cosmos defaultTtl not from the retention")
    containers = by_type("Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers")
    for container in containers:  # v1 hashes only the first 101 bytes: long keys would share partitions
        require(container.properties.get("resource", {}).get("partitionKey", {}).get("version") == 2,
                f"{container.symbol}: partition key version is not 2")  # fmt: skip
    require(any(c.properties.get("resource", {}).get("defaultTtl") == "defaultTtlSeconds" for c in containers),
            "no Cosmos container takes defaultTtl from the retention")  # fmt: skip

    for path in bicep_files(infra):
        for name in parse(path).get("outputs", {}):
            require(not re.search(r"key|secret|password", name, re.IGNORECASE), f"{path.name}: output {name} leaks")
    return found


def _scope_symbol(scope: Any) -> str | None:
    """The resource a role's ``scope`` names: ``symbol``, or ``symbol[i]`` in a loop."""
    if isinstance(scope, dict) and scope.get("operator", {}).get("type") == "index_accessor":
        scope = scope["operator"]["operands"]["operand_1"]
    return scope if isinstance(scope, str) and scope.isidentifier() else None


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.infra_checks", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["policies"])
    parser.add_argument("infra", nargs="?", type=Path, default=INFRA, help="the infra folder (default: infra/)")
    args = parser.parse_args(argv[1:])
    infra = args.infra
    if not (infra / "main.bicep").is_file():
        print(f"infra_checks: error: no main.bicep in {infra}", file=sys.stderr)
        return 2
    violations = policy_violations(infra)
    for violation in violations:
        print("POLICY", violation)
    recipes = (infra / "recipes.json").read_text().strip() if (infra / "recipes.json").is_file() else "none"
    print(f"{len(bicep_files(infra))} Bicep files parsed, recipes {recipes}, {len(violations)} policy violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
