"""The dedup consumer's cost end to end, through the real Azure Functions Python worker
(release 4.34.0, lab/runtime): one worker process, one Azurite, ``concurrency`` Service Bus
invocations in flight at once (the trigger's default, 16; PYTHON_THREADPOOL_THREAD_COUNT too),
sent over the worker's gRPC stream as the Functions host sends them.

Two functions of one app (lab/bench/worker_app.py) on the same store account:

- ``dedup``: a consumer as the template declares them, on the app's default store (Table
  Storage, lean transactions), processing new orders: one transaction of order, ledger
  posting and marker;
- ``plain``: the same business transaction without dedup (``baseline(lean=True)`` of
  lab/bench/__main__.py): parse, validate, the same entities, one lean transaction.

Both run WARM_UP messages untimed, fewer in a short run (Azurite and the worker get faster
after warm-up), then alternate for ``rounds`` short rounds, the order flipped each round, so that the machine's
changing load falls on both alike; messages and seconds are pooled per function and ``ratio``
is dedup / plain messages per second. Store requests per message come from the
``dedup.store.requests`` counter in the worker (an in-memory OpenTelemetry reader, read
between phases over an HTTP function); the CPU each message costs, per process (the worker,
Azurite, and this process playing the host), from /proc; ``cpu_ratio`` is plain / dedup CPU
per message, all three processes: where the throughput ratio comes from when the machine's
cores are the limit (on a small machine they are, and the three share them). After the run
every order is checked in the store: one order record and one ledger posting each (and one
dedup marker, for ``dedup``).

``measure()`` starts its own Azurite unless given a running one, and the worker always. When
no worker release is available (FUNCTIONS_PYTHON_WORKER unset, `make worker` not run) it
returns ``{"skipped": reason}``; anything else that goes wrong raises.

    python -m lab.bench.worker [--messages 400] [--concurrency 16] [--rounds 4] [--no-request-count]

prints the result as JSON; exits 1 when an invocation failed, an order was not stored exactly
once, or a target is missed (the store requests per message; the ratio's FLOOR, a collapse), 0
otherwise (a skip included).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient

from lab.order_effects import OrderEffects, effects_by_order
from lab.runtime import build
from lab.runtime.host import WorkerHost
from lab.runtime.triggers import Http, Invocation, ServiceBusMessage, http, http_result, servicebus
from shared.idempotency.stores import TableStore
from shared.idempotency.stores._expiry import NOTES_PER_ROW
from shared.idempotency.testing.azurite import Azurite

ROOT = Path(__file__).resolve().parents[2]
APP_SOURCE = Path(__file__).with_name("worker_app.py")
DOCUMENTED = json.loads((ROOT / "local.settings.json.example").read_text())["Values"]
# dedup / plain messages per second: reported, and judged only by a floor that catches a collapse (the ratio
# moves with this shared machine by a tenth between runs; the marker is a third
# entity per transaction, and Azurite spends it on the same two cores). What the noise cannot move is judged:
# the store requests per message through the worker (``targets``), and the client's instructions (instructions.py).
FLOOR = 0.5
MESSAGES, ROUNDS, WARM_UP = 400, 4, 1000  # per function: each timed round's messages, the rounds, the untimed ones
FUNCTIONS = ("dedup", "plain")
PROCESSES = ("worker", "azurite", "host")  # where a message's CPU goes: the worker, the store, the host's side


@dataclass
class Phase:
    """``messages`` invocations of one function, ``concurrency`` at once."""

    messages: int
    seconds: float
    requests: int | None  # the store clients' requests (None: not counted)
    cpu: dict[str, float]  # CPU seconds by process (PROCESSES)


@dataclass
class Pooled:
    """One function's timed phases, added up."""

    messages: int = 0
    seconds: float = 0.0
    requests: int | None = 0
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROCESSES, 0.0))

    def add(self, phase: Phase) -> None:
        self.messages += phase.messages
        self.seconds += phase.seconds
        self.requests = None if phase.requests is None or self.requests is None else self.requests + phase.requests
        for process, seconds in phase.cpu.items():
            self.cpu[process] += seconds

    def requests_per_message(self) -> float | None:
        return None if self.requests is None else round(self.requests / self.messages, 3)

    def cpu_ms_per_message(self) -> dict[str, float]:
        per = {process: round(seconds * 1000 / self.messages, 3) for process, seconds in self.cpu.items()}
        return {**per, "total": round(sum(self.cpu.values()) * 1000 / self.messages, 3)}


@contextmanager
def app_folder(runtime: build.Runtime) -> Iterator[build.Runtime]:
    """The bench app deployed beside the template's: its own folder under .runtime holding
    function_app.py (lab/bench/worker_app.py), the deployed ``shared`` and ``consumers`` packages (the
    orders handler is consumers/orders.py's) and host.json, and the deployed app's .python_packages
    (linked, not reinstalled)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-app-", dir=build.CACHE))
    try:
        for package in ("shared", "consumers"):
            shutil.copytree(runtime.app / package, folder / package)
        shutil.copy2(runtime.app / "host.json", folder / "host.json")
        shutil.copy2(APP_SOURCE, folder / "function_app.py")
        (folder / ".python_packages").symlink_to(runtime.app / ".python_packages", target_is_directory=True)
        yield build.Runtime(python=runtime.python, worker=runtime.worker, app=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def order_body(order_id: str, i: int) -> bytes:
    order = {"orderId": order_id, "customerId": "c-1", "amount": 10.0 + i % 7, "currency": "EUR",
             "items": [{"sku": "a", "quantity": 1}]}  # fmt: skip
    return json.dumps(order).encode()


class Run:
    """One worker and the orders sent to each of its functions."""

    def __init__(self, host: WorkerHost, azurite: Azurite, concurrency: int) -> None:
        self.host = host
        self.azurite = azurite
        self.concurrency = concurrency
        self.sent: dict[str, list[str]] = {name: [] for name in FUNCTIONS}
        self.ok: Counter[str] = Counter()
        self.failures: list[str] = []

    def invocations(self, function: str, n: int) -> list[Invocation]:
        """``n`` new orders, MessageId = orderId (as the orders queue's producer sends them)."""
        prefix = f"{function[0]}{uuid.uuid4().hex[:8]}"
        binding = self.host.trigger(function)
        ids = [f"{prefix}-{i}" for i in range(n)]
        self.sent[function] += ids
        return [servicebus(binding, ServiceBusMessage(order_body(id_, i), id_)) for i, id_ in enumerate(ids)]

    def phase(self, function: str, n: int) -> Phase:
        """``n`` new orders to ``function``, ``concurrency`` invocations in flight at once."""
        calls = self.invocations(function, n)
        before = self.store_requests()
        cpu = self.cpu()
        started = time.perf_counter()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="bench-host") as pool:
            responses = list(pool.map(lambda call: self.host.invoke(function, call), calls))
        seconds = time.perf_counter() - started
        cpu = {process: spent - cpu[process] for process, spent in self.cpu().items()}
        after = self.store_requests()
        for response in responses:
            failed = self.host.failed(response)
            if failed is None:
                self.ok[function] += 1
            else:
                self.failures.append(f"{function}: {failed}")
        return Phase(n, seconds, None if before is None or after is None else after - before, cpu)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process (this one: the host's side, its threads included)."""
        return {"worker": self.host.cpu_seconds(), "azurite": self.azurite.cpu_seconds(), "host": time.process_time()}

    def store_requests(self) -> int | None:
        """The worker's ``dedup.store.requests`` so far (null when not counted)."""
        request = Http("GET", "/api/bench/requests", {})
        response = self.host.invoke("bench_requests", http(self.host.trigger("bench_requests"), request))
        if self.host.failed(response):
            raise RuntimeError(f"bench_requests failed: {self.host.exception(response)}")
        status, _, body = http_result(self.host.pb, response)
        if status != 200:
            raise RuntimeError(f"bench_requests answered {status}")
        value = json.loads(body)["store_requests"]
        return None if value is None else int(value)


def check(store: TableStore, sent: list[str], *, markers: bool) -> dict[str, int]:
    """What is stored for ``sent``: each order once with one ledger posting (and, for the
    dedup consumer, one marker); ``violations`` counts the orders that are not so, and
    orders stored that were never sent."""
    found = effects_by_order(store)
    marked = Counter(item.key.id for item in store.scan() if item.key is not None and item.key.scope == "orders")
    expected = set(sent)
    violations = sum(found.get(order_id) != OrderEffects(1, 1) for order_id in expected)
    violations += len(set(found) - expected)
    if markers:
        violations += sum(marked[order_id] != 1 for order_id in expected) + len(set(marked) - expected)
    elif marked:
        violations += len(marked)  # the plain function writes no marker
    return {"stored_orders": sum(e.orders for e in found.values()),
            "stored_postings": sum(e.charges for e in found.values()), "markers": sum(marked.values()),
            "violations": violations}  # fmt: skip


def skip_reason() -> str | None:
    """Why the worker cannot run here (None when it can). FUNCTIONS_PYTHON_WORKER naming a
    path that does not exist raises: a misconfiguration is not a skip."""
    if build.configured() is None:
        return (f"the Azure Functions Python worker {build.RELEASE} is not available: set {build.SOURCE_SETTING} to "
                "its release archive or run `make worker`")  # fmt: skip
    return None


def measure(messages: int = MESSAGES, concurrency: int = 16, rounds: int = ROUNDS, *, azurite: Azurite | None = None,
            count_requests: bool = True) -> dict[str, Any]:  # fmt: skip
    """The paired measurement (module docstring). ``azurite``: a running Azurite started by
    this process (its CPU is read from /proc; default: one started here, in memory, and
    stopped after); the tables made here are dropped after the check."""
    reason = skip_reason()
    if reason is not None:
        return {"skipped": reason}
    started = time.perf_counter()
    runtime = build.prepare()
    with ExitStack() as stack:
        server = azurite or stack.enter_context(Azurite())
        table = "bw" + uuid.uuid4().hex[:12]
        service = TableServiceClient.from_connection_string(server.connection_string)
        plain_store = TableStore(service, table + "plain", table + "plaindl")
        plain_store.create_tables()
        settings = {**DOCUMENTED, "DEDUP_STORAGE_CONNECTION": server.connection_string, "DEDUP_TABLE": table,
                    "DEDUP_DEADLETTER_TABLE": table + "dl", "BENCH_PLAIN_TABLE": table + "plain",
                    "PYTHON_THREADPOOL_THREAD_COUNT": str(concurrency),
                    "BENCH_COUNT_STORE_REQUESTS": "1" if count_requests else "0"}  # fmt: skip
        app = stack.enter_context(app_folder(runtime))
        host = stack.enter_context(WorkerHost(app, settings)).start_app()
        run = Run(host, server, concurrency)
        for function in FUNCTIONS:  # untimed: the store is built, Azurite's and the worker's paths warm
            run.phase(function, min(WARM_UP, messages * rounds))
        pooled = {name: Pooled() for name in FUNCTIONS}
        per_round = []
        for round_ in range(rounds):
            rates = {}
            for function in FUNCTIONS if round_ % 2 == 0 else FUNCTIONS[::-1]:
                phase = run.phase(function, messages)
                pooled[function].add(phase)
                rates[f"{function}_per_s"] = round(phase.messages / phase.seconds, 1)
            per_round.append(rates)
            print(f"[round {round_ + 1}/{rounds}] {json.dumps(rates)}", file=sys.stderr)
        dedup_store = TableStore(service, table, table + "dl")
        checks = {"dedup": check(dedup_store, run.sent["dedup"], markers=True),
                  "plain": check(plain_store, run.sent["plain"], markers=False)}  # fmt: skip
        for name in (table, table + "dl", table + "plain", table + "plaindl"):  # a caller's Azurite stays clean
            service.delete_table(name)
    rate = {name: p.messages / p.seconds for name, p in pooled.items()}
    ratio = rate["dedup"] / rate["plain"]
    sides = {
        name: {
            "timed_messages": pooled[name].messages,
            "timed_seconds": round(pooled[name].seconds, 3),
            "sent": len(run.sent[name]),
            "succeeded": run.ok[name],
            "store_requests_per_message": pooled[name].requests_per_message(),
            "cpu_ms_per_message": pooled[name].cpu_ms_per_message(),
            **checks[name],
        }
        for name in FUNCTIONS
    }
    return {
        "worker": build.RELEASE,
        "messages_per_round": messages,
        "rounds": rounds,
        "concurrency": concurrency,
        "dedup_per_s": round(rate["dedup"], 1),
        "plain_per_s": round(rate["plain"], 1),
        "ratio": round(ratio, 3),
        "cpu_ratio": round(
            pooled["plain"].cpu_ms_per_message()["total"] / pooled["dedup"].cpu_ms_per_message()["total"], 3
        ),
        "target": targets(ratio, pooled["dedup"], rounds),
        "violations": sum(side["violations"] for side in checks.values()),
        "failed_invocations": len(run.failures),
        "first_failures": run.failures[:3],
        "per_round": per_round,
        "dedup": sides["dedup"],
        "plain": sides["plain"],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def targets(ratio: float, dedup: Pooled, rounds: int) -> dict[str, bool]:
    """The ratio; and, when counted, one store request per message (the commit) plus the
    expiry index's rows, which land in whichever phase writes them: one per NOTES_PER_ROW
    markers, and at most one more per round (a partial row of the flush timer's, a row of
    the warm-up's)."""
    found = {f"ratio >= {FLOOR} (a floor)": ratio >= FLOOR}
    if dedup.requests is not None:
        limit = dedup.messages * (1 + 1 / NOTES_PER_ROW) + rounds
        found[f"dedup: 1 store request per message, + <= 1/{NOTES_PER_ROW} + 1 per round for the expiry index"] = (
            dedup.messages <= dedup.requests <= limit
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--messages", type=int, default=MESSAGES, help="messages per function per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--no-request-count", action="store_true", help="no OpenTelemetry counter in the worker")
    args = parser.parse_args(argv)
    result = measure(args.messages, args.concurrency, args.rounds, count_requests=not args.no_request_count)
    print(json.dumps(result, indent=1))
    if "skipped" in result:
        return 0
    met = all(result["target"].values())  # judged unrounded
    return 0 if result["violations"] == 0 and result["failed_invocations"] == 0 and met else 1


if __name__ == "__main__":
    sys.exit(main())
