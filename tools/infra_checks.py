"""Checks on infra/ that need no Bicep compiler: the Bicep files are parsed (PyPI
``pycep-parser``) and the security policies asserted on the parsed tree. (What the brokers
may redeliver, against the dedup settings, is tools/delivery_checks.py.)

    python -m tools.infra_checks policies [infra_dir]
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pycep import BicepParser

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"


def parse(path: Path) -> dict[str, Any]:
    tree: dict[str, Any] = dict(BicepParser().parse(file_path=path))
    return tree


def bicep_files(infra: Path) -> list[Path]:
    return sorted(infra.rglob("*.bicep"))


# -- parameters and host.json --------------------------------------------------------------


def parameter_values(infra: Path) -> dict[str, Any]:
    """Defaults from main.bicep, overridden by main.parameters.json (an azd
    ``${NAME=default}`` value counts as its default)."""
    values = {name: spec.get("default") for name, spec in parse(infra / "main.bicep")["parameters"].items()}
    parameters_file = infra / "main.parameters.json"
    if parameters_file.exists():
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


# -- policies --------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    file: str
    symbol: str
    type: str
    config: dict[str, Any]

    @property
    def properties(self) -> dict[str, Any]:
        return self.config.get("properties") or {}


def _config(spec: dict[str, Any]) -> dict[str, Any]:
    """A conditional declaration (``= if (...) {...}``) nests its body under config."""
    config: dict[str, Any] = spec.get("config") or {}
    return config["config"] if "condition" in config else config


def resources(infra: Path) -> Iterator[Resource]:
    for path in bicep_files(infra):
        for symbol, spec in parse(path).get("resources", {}).items():
            if not spec.get("existing"):
                yield Resource(path.name, symbol, spec["type"], _config(spec))


def _text(value: Any) -> str:
    return json.dumps(value, default=str)


SECRET_PATTERNS = re.compile(r"listKeys|listConnectionStrings|AccountKey=|SharedAccessKey|primaryKey|masterKey")


# The operator (smoke test) may reach single entities only: never a namespace or an account.
SENDER_SCOPES = frozenset({"Microsoft.ServiceBus/namespaces/topics", "Microsoft.ServiceBus/namespaces/queues"})
OPERATOR_SCOPES = frozenset({
    "Microsoft.ServiceBus/namespaces/queues",
    "Microsoft.EventGrid/topics",
    "Microsoft.Storage/storageAccounts/tableServices/tables",
})  # fmt: skip


def policy_violations(infra: Path = INFRA) -> list[str]:
    found: list[str] = []
    main = parse(infra / "main.bicep")
    all_resources = list(resources(infra))

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
    for entity in queues + by_type("Microsoft.ServiceBus/namespaces/topics"):
        require(
            entity.properties.get("requiresDuplicateDetection") is True, f"{entity.symbol}: duplicate detection off"
        )
        require("duplicateDetectionHistoryTimeWindow" in entity.properties, f"{entity.symbol}: no detection window")
    for entity in queues + by_type("Microsoft.ServiceBus/namespaces/topics/subscriptions"):
        require(entity.properties.get("deadLetteringOnMessageExpiration") is True,
                f"{entity.symbol}: expired messages are dropped, not dead-lettered")  # fmt: skip

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

    types = {(path.name, symbol): spec["type"] for path in bicep_files(infra)  # declared or existing
             for symbol, spec in parse(path).get("resources", {}).items()}  # fmt: skip
    for assignment in by_type("Microsoft.Authorization/roleAssignments"):
        scope = assignment.config.get("scope")
        require(isinstance(scope, str) and scope.isidentifier(),
                f"{assignment.file}:{assignment.symbol}: role assignment not scoped to a resource")  # fmt: skip
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
        if "operatorPrincipalId" in _text(assignment.properties.get("principalId")):  # the smoke test's entities
            target = types.get((assignment.file, str(scope)))
            require(target in OPERATOR_SCOPES, f"{assignment.symbol}: the operator's role reaches beyond one entity")
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
        require(runtime == {"name": "python", "version": "3.11"}, f"{site.symbol}: runtime is not Python 3.11")

    settings = _app_settings(main)
    for name in settings:
        plain_connection = name in ("AzureWebJobsStorage", "ServiceBusConnection") or (
            "connectionstring" in name.lower() and name != "APPLICATIONINSIGHTS_CONNECTION_STRING"
        )
        require(not plain_connection, f"app setting {name}: a connection string; use identity-based settings")
    require("ServiceBusConnection__fullyQualifiedNamespace" in settings, "the trigger does not use managed identity")
    require("dedupRetentionDays" in _text(settings.get("DEDUP_RETENTION")), "DEDUP_RETENTION not from the parameter")
    cosmos = _config(main.get("modules", {}).get("cosmos", {})).get("params", {})
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


def _app_settings(main: dict[str, Any]) -> dict[str, Any]:
    params = _config(main.get("modules", {}).get("functionApp", {})).get("params", {})
    settings: dict[str, Any] = params.get("appSettings") or {}
    return settings


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.infra_checks", description=__doc__.split("\n\n")[0])
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
    print(f"{len(bicep_files(infra))} Bicep files parsed, {len(violations)} policy violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
