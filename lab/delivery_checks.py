"""What the brokers may still redeliver, read from infra/ and host.json, checked against the
dedup settings (no Bicep compiler needed: the templates are parsed with pycep-parser).

    python -m lab.delivery_checks retention [infra_dir]   # markers outlive every redelivery
    python -m lab.delivery_checks leases [infra_dir]      # a dead owner's claim lapses in budget

Every Service Bus queue and topic subscription, Event Hub and Event Grid subscription that
infra/ deploys with the recipes of infra/recipes.json is read (lab.infra_checks.Deployment),
whether its values are literals or parameters (resolved through the module call to
main.bicep's defaults and main.parameters.json); a property left out takes the service's
default.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import isodate

from lab.infra_checks import (
    INFRA,
    ROOT,
    Deployment,
    RecipeError,
    blob_triggered,
    body,
    is_poison,
    main_bicep_defaults,
    parameter_values,
    parse,
    read_recipes,
    timespan,
)
from shared.idempotency.config import (
    DEFAULT_DEAD_LETTER_RETENTION,
    DEFAULT_IN_FLIGHT_WAIT,
    DEFAULT_LEASE,
    DEFAULT_MAX_DELIVERY_COUNT,
    DEFAULT_OUTBOX_SWEEP_DELAY,
    DEFAULT_TRANSIENT_WAIT,
    EXPIRY_MARGIN,
)
from shared.idempotency.dead_letters import PARK_WAIT
from shared.idempotency.downstream import DEFAULT_TIMEOUT
from shared.idempotency.functions.adapters import EVENT_GRID_WAIT
from shared.idempotency.stores._azure import TRANSPORT

QUEUE, SUBSCRIPTION = "Microsoft.ServiceBus/namespaces/queues", "Microsoft.ServiceBus/namespaces/topics/subscriptions"
EVENT_HUB = "Microsoft.EventHub/namespaces/eventhubs"
STORAGE_QUEUE = "Microsoft.Storage/storageAccounts/queueServices/queues"
STORAGE_QUEUE_TTL = timedelta(days=7)  # a queue message's default time to live (its producer may set another)
EVENT_SUBSCRIPTIONS = (
    "Microsoft.EventGrid/topics/eventSubscriptions",
    "Microsoft.EventGrid/systemTopics/eventSubscriptions",
)
# Service defaults when a property is left out.
SERVICE_BUS_DEFAULTS = {"lockDuration": "PT1M", "maxDeliveryCount": 10, "defaultMessageTimeToLive": "P10675199D"}
EVENT_GRID_DEFAULTS = {"maxDeliveryAttempts": 30, "eventTimeToLiveInMinutes": 1440}
# Event Grid's documented retry schedule (best effort, with a little randomisation) and
# how long it waits for the function's answer before it counts the attempt as failed.
EVENT_GRID_RETRIES = [timedelta(seconds=s) for s in (10, 30, 60, 300, 600, 1800, 3600, 10800, 21600)]
EVENT_GRID_EVERY = timedelta(hours=12)
EVENT_GRID_RESPONSE_TIMEOUT = timedelta(seconds=30)
SKEW = timedelta(seconds=15)  # clock skew between instances, plus the claim's own write
SWEEP_EVERY = timedelta(minutes=5)  # dispatch_outbox's schedule (functions/_housekeeping.py)
HTTP_THREADS = 16  # worker threads kept for HTTP and Event Grid calls beside the Service Bus ones


@dataclass(frozen=True)
class Redelivery:
    """One place infra/ lets the platform redeliver from."""

    name: str
    broker: str  # "service bus" or "event grid"
    max_deliveries: int
    time_to_live: timedelta
    lock: timedelta = timedelta(0)  # Service Bus only
    count: int = 1  # entities it stands for (a loop over names known at deployment only: one at least)


def redeliveries(infra: Path = INFRA, recipes: Sequence[str] | None = None,
                 host: dict[str, Any] | None = None) -> list[Redelivery]:  # fmt: skip
    """Where the platform may redeliver from, in what infra/ deploys with ``recipes``
    (default: infra/recipes.json); a Storage queue's deliveries are host.json's (``host``)."""
    deployment = Deployment(infra, recipes)
    queues = host_settings(host or _host()).queues
    values = parameter_values(infra)
    scopes: dict[str, dict[str, Any]] = {"": values}  # main.bicep's own resources read its parameters
    for call, (path, _) in deployment.calls.items():
        passed = body(deployment.main["modules"][call]).get("params", {})
        scopes[call] = {n: spec.get("default") for n, spec in parse(infra / path).get("parameters", {}).items()}
        scopes[call].update({n: _resolve(v, values) for n, v in passed.items()})
    paths = Counter(path for path, _ in deployment.calls.values())
    found: list[Redelivery] = []
    for resource in deployment.resources:
        if resource.existing:  # declared elsewhere (e.g. a role's scope): read there
            continue
        properties, scope, path = resource.properties, scopes[resource.call], resource.path
        # Each entity as deployed, ``file:symbol[its name]``; a name known at deployment only: the
        # module call tells two calls of one template apart.
        call = f"[{resource.call}]" if paths[path] > 1 and not resource.names else ""
        count = 1 if resource.names else resource.count or 1  # a loop over values known at deployment only: 1+
        for name in (f"{path}{call}:{entity}" for entity in resource.entities):
            if resource.type in (QUEUE, SUBSCRIPTION):
                value = {k: _resolve(properties.get(k, d), scope) for k, d in SERVICE_BUS_DEFAULTS.items()}
                found.append(Redelivery(name, "service bus", int(value["maxDeliveryCount"]),
                                        _duration(value["defaultMessageTimeToLive"], name),
                                        _duration(value["lockDuration"], name), count))  # fmt: skip
            elif resource.type == EVENT_HUB:  # a replay from a checkpoint, up to the hub's retention
                days = _resolve(properties.get("messageRetentionInDays", 1), scope)
                found.append(Redelivery(name, "event hubs", 1, timedelta(days=int(days))))
            elif resource.type == STORAGE_QUEUE and not is_poison(resource):  # its poison queue: none
                found.append(Redelivery(name, "storage queue", queues.max_dequeue_count, STORAGE_QUEUE_TTL,
                                        queues.visibility_timeout, count))  # fmt: skip
            elif resource.type in EVENT_SUBSCRIPTIONS:
                retry = properties.get("retryPolicy", {})
                value = {k: _resolve(retry.get(k, d), scope) for k, d in EVENT_GRID_DEFAULTS.items()}
                found.append(Redelivery(name, "event grid", int(value["maxDeliveryAttempts"]),
                                        timedelta(minutes=int(value["eventTimeToLiveInMinutes"]))))  # fmt: skip
    return found


def _resolve(value: Any, scope: dict[str, Any]) -> Any:
    """pycep gives identifiers and string literals alike: a name in scope is a parameter."""
    return scope[value] if isinstance(value, str) and value in scope else value


def _duration(value: Any, where: str) -> timedelta:
    try:
        parsed = isodate.parse_duration(str(value))
    except isodate.ISO8601Error as exc:
        raise ValueError(f"{where}: {value!r} is not a duration this check can read") from exc
    assert isinstance(parsed, timedelta)
    return parsed


# -- host.json and the dedup settings ------------------------------------------------------------


@dataclass(frozen=True)
class StorageQueues:
    """host.json ``extensions.queues`` (the Storage Queues extension's defaults where unset)."""

    max_dequeue_count: int = 5
    visibility_timeout: timedelta = timedelta(0)  # before a failed message is visible again
    batch_size: int = 16
    new_batch_threshold: int = 8  # the next batch is fetched when this few are left: batch + it run at once


@dataclass(frozen=True)
class Host:
    function_timeout: timedelta
    lock_renewal: timedelta  # serviceBus.maxAutoLockRenewalDuration
    max_concurrent_calls: int  # serviceBus.maxConcurrentCalls, per function
    queues: StorageQueues = StorageQueues()
    poison_blob_threshold: int = 5  # blobs.poisonBlobThreshold: a blob trigger's runs
    blob_parallelism: int = 8  # blobs.maxDegreeOfParallelism: blob trigger runs at once (8 x cores by default)


def host_settings(host: dict[str, Any]) -> Host:
    extensions = host.get("extensions", {})
    service_bus, queues, blobs = (extensions.get(name, {}) for name in ("serviceBus", "queues", "blobs"))
    renewal = service_bus.get("maxAutoLockRenewalDuration", "00:05:00")
    batch = int(queues.get("batchSize", 16))
    visible = timespan(queues.get("visibilityTimeout", "00:00:00"))
    storage = StorageQueues(int(queues.get("maxDequeueCount", 5)), visible, batch,
                            int(queues.get("newBatchThreshold", batch // 2)))  # fmt: skip
    return Host(timespan(host.get("functionTimeout", "00:05:00")), timespan(renewal),
                int(service_bus.get("maxConcurrentCalls", 16)), storage, int(blobs.get("poisonBlobThreshold", 5)),
                int(blobs.get("maxDegreeOfParallelism", 8)))  # fmt: skip


@dataclass(frozen=True)
class Dedup:
    lease: timedelta
    in_flight_wait: timedelta
    call_timeout: timedelta  # a step's downstream call
    dead_letter_retention: timedelta
    transient_wait: timedelta  # how long a Service Bus delivery waits for a transient failure to clear
    max_deliveries: int  # DEDUP_MAX_DELIVERY_COUNT: when the consumer records why before the broker dead-letters


# The longest one store request can take: azure-core's attempts, each up to its connect and read
# timeouts, and the backoff between them (commits are not resent by azure-core: this bounds reads).
STORE_REQUEST = (TRANSPORT["retry_total"] + 1) * timedelta(
    seconds=TRANSPORT["connection_timeout"] + TRANSPORT["read_timeout"]
) + TRANSPORT["retry_total"] * timedelta(seconds=TRANSPORT["retry_backoff_max"])


def app_settings(infra: Path = INFRA, recipes: Sequence[str] | None = None) -> Callable[[str, str], str]:
    """The app settings main.bicep gives the function app with ``recipes`` (default:
    infra/recipes.json), read once: ``lookup(name, default)`` (``'${param}'`` interpolations
    resolved)."""
    settings = Deployment(infra, recipes).app_settings()
    values = parameter_values(infra)

    def lookup(name: str, default: str) -> str:
        value = str(_resolve(settings.get(name, default), values))
        return re.sub(r"\$\{(\w+)\}", lambda match: str(values[match.group(1)]), value)

    return lookup


def dedup_settings(infra: Path = INFRA, recipes: Sequence[str] | None = None) -> Dedup:
    """The DEDUP_* settings as infra sets them, else the library's defaults."""
    text = app_settings(infra, recipes)

    def setting(name: str, default: str) -> timedelta:
        return _duration(text(name, default), name)

    return Dedup(setting("DEDUP_LEASE", DEFAULT_LEASE), setting("DEDUP_IN_FLIGHT_WAIT", DEFAULT_IN_FLIGHT_WAIT),
                 timedelta(seconds=DEFAULT_TIMEOUT),
                 setting("DEDUP_DEAD_LETTER_RETENTION", DEFAULT_DEAD_LETTER_RETENTION),
                 setting("DEDUP_TRANSIENT_WAIT", DEFAULT_TRANSIENT_WAIT),
                 int(text("DEDUP_MAX_DELIVERY_COUNT", DEFAULT_MAX_DELIVERY_COUNT)))  # fmt: skip


# -- the checks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    lines: list[str]
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures

    def explain(self) -> str:
        verdict = "OK" if self.ok else "FAIL"
        return "\n".join(
            [f"{verdict}:", *(f"  {line}" for line in self.lines), *(f"  FAIL {f}" for f in self.failures)]
        )


def retention_check(infra: Path = INFRA, host: dict[str, Any] | None = None,
                    recipes: Sequence[str] | None = None) -> Report:  # fmt: skip
    """Markers must outlive the last copy the brokers may still deliver, plus the time
    operators may take to resubmit from a dead-letter queue:

    - Service Bus: a message can wait up to its TTL, and each of maxDeliveryCount deliveries
      can hold it for the lock duration or, with the host's renewal, maxAutoLockRenewalDuration;
    - Event Grid: retries stop after eventTimeToLiveInMinutes;
    - a Storage queue: a message lives 7 days (the default its producer may change), and each of
      maxDequeueCount dequeues can hold it for functionTimeout, then visibilityTimeout;
    - Event Hubs: a replay from a checkpoint (a restart, a rebalance) brings events back up to
      the hub's messageRetentionInDays.

    What is read is what infra/ deploys with ``recipes`` (default: infra/recipes.json).
    """
    timing = host_settings(host or _host())
    renewal = timing.lock_renewal
    values = parameter_values(infra)
    retention = timedelta(days=int(values["dedupRetentionDays"]))
    margin = timedelta(days=int(values["deadLetterResubmitDays"]))
    lines = [f"recipes {_recipes(infra, recipes)}",
             f"dedup retention {_days(retention)}; dead-letter resubmission margin {_days(margin)}; expiry margin "
             f"{EXPIRY_MARGIN}: a message first enqueued more than {_days(retention - EXPIRY_MARGIN)} ago is "
             "refused (expired)"]  # fmt: skip
    failures: list[str] = []
    for place in redeliveries(infra, recipes, host or _host()):
        # Each delivery holds the message: for its lock (or the host's renewal), or a Storage queue
        # message's whole run (the host renews its lease) and its visibility timeout after.
        each = {"service bus": max(place.lock, renewal),
                "storage queue": timing.function_timeout + place.lock}.get(place.broker, timedelta(0))  # fmt: skip
        window = place.time_to_live + place.max_deliveries * each
        explained = (f"{place.name} ({place.broker}): TTL {_days(place.time_to_live)}"
                     + (f" + {place.max_deliveries} deliveries x {each}" if each else "")
                     + f" + margin + expiry margin = {_days(window + margin + EXPIRY_MARGIN)}")  # fmt: skip
        (lines if window + margin + EXPIRY_MARGIN <= retention else failures).append(explained)
    records = dedup_settings(infra, recipes).dead_letter_retention
    (lines if records >= margin else failures).append(
        f"dead-letter records kept {_days(records)} >= resubmission margin (DEDUP_DEAD_LETTER_RETENTION)"
    )
    return Report(lines, failures)


def lease_check(infra: Path = INFRA, host: dict[str, Any] | None = None,
                recipes: Sequence[str] | None = None) -> Report:  # fmt: skip
    """Waiting, leases and delivery budgets agree:

    - a delivery that waits for a transient failure to clear (DEDUP_TRANSIENT_WAIT; then
      its last attempt: a claim's in-flight wait, a step's call, a store request) ends
      within functionTimeout and keeps its lock (lock duration, or the host's renewal);
    - Service Bus redelivers an abandoned message at once, so its deliveries wait back to
      back: maxDeliveryCount x DEDUP_TRANSIENT_WAIT is the longest store outage survived
      without a broker dead-letter (stated, not required);
    - DEDUP_MAX_DELIVERY_COUNT is every queue's maxDeliveryCount (the consumer records why
      a message fails on its last delivery, before the broker dead-letters it);
    - a claim whose owner died lapses while the broker still has deliveries left: each later
      delivery that meets the live claim waits at least DEDUP_IN_FLIGHT_WAIT (Service Bus:
      DEDUP_TRANSIENT_WAIT); for Event Grid, its retry delays count too; and a live owner
      keeps its claim through its call: lease >= call timeout + skew.

    What is read is what infra/ deploys with ``recipes`` (default: infra/recipes.json)."""
    timing, dedup = host_settings(host or _host()), dedup_settings(infra, recipes)
    settings = app_settings(infra, recipes)
    lines = [f"recipes {_recipes(infra, recipes)}",
             f"lease {dedup.lease}, in-flight wait {dedup.in_flight_wait}, transient wait {dedup.transient_wait}, "
             f"step call timeout {dedup.call_timeout}, store request at most {STORE_REQUEST}, "
             f"functionTimeout {timing.function_timeout}, lock renewal {timing.lock_renewal}"]  # fmt: skip
    failures: list[str] = []

    def require(condition: bool, text: str) -> None:
        (lines if condition else failures).append(text)

    needed = dedup.lease + SKEW
    require(dedup.lease >= dedup.call_timeout + SKEW, f"lease {dedup.lease} >= call timeout + skew")
    # Waiting, then a last attempt as slow as any before it (a claim's wait, a call, the commit),
    # then the last delivery's dead-letter record (a park: tried again for up to PARK_WAIT). A store
    # that hangs on several requests of one message can still take longer: the host then abandons
    # the invocation (nothing is lost).
    longest = dedup.transient_wait + dedup.in_flight_wait + dedup.call_timeout + 2 * STORE_REQUEST + PARK_WAIT
    require(longest <= timing.function_timeout,
            f"a waiting delivery ({longest}: waits, a last attempt, a record) <= functionTimeout")  # fmt: skip
    sweep_delay = _duration(settings("DEDUP_OUTBOX_SWEEP_DELAY", DEFAULT_OUTBOX_SWEEP_DELAY), "sweep")
    require(sweep_delay > timing.function_timeout,
            f"DEDUP_OUTBOX_SWEEP_DELAY {sweep_delay} > functionTimeout: the sweep never races a call")  # fmt: skip
    places = redeliveries(infra, recipes, host or _host())
    queues = sum(place.count for place in places if place.broker == "service bus")
    storage = sum(place.count for place in places if place.broker == "storage queue")
    blobs = timing.blob_parallelism if blob_triggered(infra, recipes) else 0
    per_storage_queue = timing.queues.batch_size + timing.queues.new_batch_threshold
    threads = int(settings("PYTHON_THREADPOOL_THREAD_COUNT", "0"))
    needed_threads = queues * timing.max_concurrent_calls + storage * per_storage_queue + blobs + HTTP_THREADS
    require(threads >= needed_threads,
            f"PYTHON_THREADPOOL_THREAD_COUNT {threads} >= {queues} Service Bus entities x maxConcurrentCalls "
            f"{timing.max_concurrent_calls}"
            + (f" + {storage} Storage queues x (batchSize + newBatchThreshold) {per_storage_queue}" if storage else "")
            + (f" + blob trigger runs {blobs} (maxDegreeOfParallelism)" if blobs else "")
            + f" + {HTTP_THREADS} (HTTP, Event Grid): waiting holds a thread")  # fmt: skip
    survived: list[timedelta] = []
    for place in places:
        if place.broker == "event hubs":  # no lock, no delivery count: the retry policy and parking
            continue
        later = place.max_deliveries - 1
        if place.broker == "service bus":
            require(longest <= max(place.lock, timing.lock_renewal),
                    f"{place.name}: a waiting delivery keeps its lock ({longest} <= lock or renewal)")  # fmt: skip
            require(place.max_deliveries == dedup.max_deliveries,
                    f"{place.name}: maxDeliveryCount {place.max_deliveries} == DEDUP_MAX_DELIVERY_COUNT "
                    f"{dedup.max_deliveries}")  # fmt: skip
            survived.append(place.max_deliveries * dedup.transient_wait)
            covered = later * max(dedup.in_flight_wait, dedup.transient_wait)
        elif place.broker == "storage queue":  # the host renews its lease: no lock to keep; a failure waits visibility
            outage = place.max_deliveries * (dedup.transient_wait + place.lock)
            require(outage < place.time_to_live,
                    f"{place.name}: a store outage of up to {outage} is survived before its poison queue "
                    f"(maxDequeueCount {place.max_deliveries} x (DEDUP_TRANSIENT_WAIT + visibilityTimeout "
                    f"{place.lock})), within a message's time to live {place.time_to_live.days} d")  # fmt: skip
            covered = later * (max(dedup.in_flight_wait, dedup.transient_wait) + place.lock)
        else:
            # waiting only: a store that hangs can hold a delivery past it; Event Grid then retries
            answer, waited = EVENT_GRID_RESPONSE_TIMEOUT, EVENT_GRID_WAIT + dedup.in_flight_wait + dedup.call_timeout
            require(waited < answer,
                    f"{place.name}: a waiting delivery ({waited}) answers Event Grid within {answer}")  # fmt: skip
            retries = sum(_event_grid_delays(later), timedelta(0)) + later * dedup.in_flight_wait
            covered = min(retries, place.time_to_live)  # no retry after the event's time to live
        require(covered >= needed, f"{place.name}: {later} later deliveries cover {covered} >= lease + skew {needed}")
    if blobs:
        outage = timing.poison_blob_threshold * dedup.transient_wait
        lines.append(f"blob trigger: a store outage of up to {outage} is survived before webjobs-blobtrigger-poison "
                     f"(poisonBlobThreshold {timing.poison_blob_threshold} runs, each stopping once a chunk waited "
                     "DEDUP_TRANSIENT_WAIT; the next run resumes where it stopped)")  # fmt: skip
    if survived:
        lines.append(f"a store outage of up to {min(survived)} is survived without a Service Bus dead-letter "
                     "(maxDeliveryCount x DEDUP_TRANSIENT_WAIT; no progress meanwhile, then it recovers)")  # fmt: skip
        redelivered = max(p.max_deliveries for p in places if p.broker == "service bus") * longest
        lines.append(outbox_window(infra, redelivered, recipes))
    return Report(lines, failures)


def outbox_window(infra: Path, redelivered: timedelta, recipes: Sequence[str] | None = None) -> str:
    """How late the outbox re-sends a message after its first try, against the destination's
    duplicate-detection window (stated, not required: the subscribers' dedup holds past it)."""
    window = _duration(parameter_values(infra).get("duplicateDetectionWindow") or "PT10M", "detection window")
    delay = app_settings(infra, recipes)("DEDUP_OUTBOX_SWEEP_DELAY", DEFAULT_OUTBOX_SWEEP_DELAY)
    latest = max(redelivered, _duration(delay, "DEDUP_OUTBOX_SWEEP_DELAY") + SWEEP_EVERY)
    verdict = (
        "drops every such re-send"
        if window >= latest
        else ("drops the earlier re-sends; later ones reach the subscribers, whose dedup (by orderId) holds")
    )
    return (f"outbox: a re-send comes up to {latest} after the first try while the destination recovers "
            f"(redeliveries: maxDeliveryCount x a waiting delivery, {redelivered}; sweep: "
            f"DEDUP_OUTBOX_SWEEP_DELAY + {SWEEP_EVERY}); duplicate detection ({window}) {verdict}")  # fmt: skip


def _recipes(infra: Path, recipes: Sequence[str] | None) -> str:
    return json.dumps(list(recipes) if recipes is not None else read_recipes(infra))


def _event_grid_delays(count: int) -> list[timedelta]:
    return [EVENT_GRID_RETRIES[i] if i < len(EVENT_GRID_RETRIES) else EVENT_GRID_EVERY for i in range(count)]


def _host() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / "host.json").read_text())
    return loaded


def _days(value: timedelta) -> str:
    return f"{value.total_seconds() / 86400:.2f} days"


ADVICE = {
    "retention": "Markers would expire while the broker can still redeliver: raise dedupRetentionDays "
    "(main.bicep's default and infra/main.parameters.json), or shorten the broker's windows.",
    "leases": "A crashed step owner's claim would outlive the redeliveries: shorten DEDUP_LEASE, lengthen "
    "DEDUP_IN_FLIGHT_WAIT (within the lock and functionTimeout), or raise maxDeliveryCount.",
}


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command not in ADVICE or "--help" in argv:
        print(__doc__)
        return 0 if "--help" in argv else 2
    infra = Path(argv[2]) if len(argv) > 2 else INFRA
    if not (infra / "main.bicep").is_file():
        print(f"delivery_checks: error: no main.bicep in {infra}", file=sys.stderr)
        return 2
    check = retention_check if command == "retention" else lease_check
    try:  # each deployment's values: azd's parameters file, or main.bicep's defaults (az deployment)
        azd = check(infra)
        with main_bicep_defaults():
            defaults = check(infra)
    except RecipeError as exc:
        print(f"delivery_checks: error: {exc}", file=sys.stderr)
        return 2
    if (azd.lines, azd.failures) == (defaults.lines, defaults.failures):
        print(f"{AZD} and {DEFAULTS} (the same values):\n{azd.explain()}")
    else:
        print(f"{AZD}:\n{azd.explain()}\n{DEFAULTS}:\n{defaults.explain()}")
    ok = azd.ok and defaults.ok
    if not ok:
        print(ADVICE[command])
    return 0 if ok else 1


AZD = "As azd deploys it (infra/main.parameters.json over main.bicep's defaults)"
DEFAULTS = "as az deployment group create deploys it (main.bicep's defaults, docs/operations.md)"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
