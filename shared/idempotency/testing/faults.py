"""Seeded fault injection at the points that matter, below the SDK's retry policy (an
HTTP transport) and around the worker's settlement. Thread interleavings still vary from
run to run; the seed fixes the workload and the fault draws' sequence."""

from __future__ import annotations

import copy
import io
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import requests
import urllib3
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import HttpTransport, RequestsTransport, RequestsTransportResponse
from azure.core.rest import HttpRequest as RestHttpRequest


class Crash(BaseException):
    """The worker process died here. BaseException, so that no ``except Exception`` in
    the app can swallow it; the harness then leaves the message unsettled."""


STORE_FAULTS = (
    "store_503",
    "store_timeout",
    "response_lost",
    "crash_before_commit",
    "crash_after_commit",
    "lock_expiry",
)
WORKER_FAULTS = ("crash_before_ack", "lost_ack")


class FaultPlan:
    """``rate``: the share of store requests (and settlements) that meet a fault.
    ``throttle(rate, seconds)``: for a while, that share of store requests is answered
    503 as a throttled service answers. ``lose_lock``: how a ``lock_expiry`` fault takes
    the current delivery's lock away (the harness knows which delivery runs where).
    ``settled_without_invoke``: the share of deliveries the host completes without invoking the
    function (Azure/azure-functions-host#11879); ``vanished``: each one's sequence number, MessageId
    and body."""

    def __init__(self, rate: float, seed: int, lock_duration: float) -> None:
        self.rate = rate
        self.lock_duration = lock_duration
        self._rng = random.Random(seed)
        self._mutex = threading.Lock()
        self.injected: Counter[str] = Counter()
        self.lose_lock: Callable[[], None] = lambda: None
        self._throttle_rate = 0.0
        self._throttle_until = 0.0
        self.settled_without_invoke = 0.0
        self.latency = 0.0  # seconds each call of a store without a transport takes (faulty_calls)
        self.vanished: list[tuple[int, str | None, bytes]] = []
        self._here = threading.local()  # per delivery (``delivering``): whether a commit of it reached the store

    def draw(self, kinds: tuple[str, ...], rate: float | None = None) -> str | None:
        """One of ``kinds`` at the plan's rate (or ``rate``), counted; else None."""
        rate = self.rate if rate is None else rate
        with self._mutex:
            if rate <= 0 or self._rng.random() >= rate:
                return None
            kind = self._rng.choice(kinds)
            self.injected[kind] += 1
            return kind

    def throttle(self, rate: float, seconds: float) -> None:
        with self._mutex:
            self._throttle_rate, self._throttle_until = rate, time.monotonic() + seconds

    def around(self, kinds: tuple[str, ...], call: Callable[[], Any], refused: Callable[[str], Any],
               lost: Callable[[], BaseException]) -> Any:  # fmt: skip
        """``call`` meeting at most one fault of ``kinds``: refused before it (``refused`` answers or
        raises for ``store_503`` and ``store_timeout``; throttling too), the worker crashed before or
        after it, the delivery's lock lost meanwhile, or its answer lost once it applied (``lost()``)."""
        if self.throttled():
            return refused("store_503")
        fault = self.draw(kinds)
        if fault in ("store_503", "store_timeout"):
            return refused(fault)
        if fault == "crash_before_commit":  # after an earlier commit of the delivery (an attempt whose answer was
            # lost, a batch's first transaction), it is a crash after a commit
            raise Crash("crash_after_commit" if getattr(self._here, "committed", False) else fault)
        if fault == "lock_expiry":  # the lock is lost mid-call: another worker receives the message meanwhile
            self.lose_lock()
            time.sleep(self.lock_duration * 0.5)
        answer = call()
        if "crash_before_commit" in kinds and (fault == "response_lost" or _wrote(answer)):
            self._here.committed = True
        if fault == "response_lost":
            raise lost()
        if fault == "crash_after_commit":
            raise Crash(fault)
        return answer

    def delivering(self) -> None:
        """A new delivery starts on this thread: none of its commits reached the store yet."""
        self._here.committed = False

    def throttled(self) -> bool:
        with self._mutex:
            if time.monotonic() >= self._throttle_until or self._rng.random() >= self._throttle_rate:
                return False
            self.injected["throttled_503"] += 1
            return True


class PassThrough(HttpTransport):  # type: ignore[type-arg]
    """A transport in front of ``inner`` (the store's own: requests for the SDK's clients,
    urllib3 for lean transactions); subclasses change what ``send`` does."""

    def __init__(self, inner: HttpTransport | None = None) -> None:  # type: ignore[type-arg]
        self._inner = inner or RequestsTransport()

    def send(self, request: Any, **kwargs: Any) -> Any:
        return self._inner.send(request, **kwargs)

    def open(self) -> None:
        self._inner.open()

    def close(self) -> None:
        self._inner.close()

    def __exit__(self, *args: Any) -> None:
        self._inner.__exit__(*args)


class FaultyTransport(PassThrough):
    """Answers some requests with 503, times some out, loses some responses after the
    server applied them, crashes the worker around commits, or loses the delivery's lock
    mid-commit so that another worker receives the redelivery meanwhile. The other
    requests go through to the store."""

    def __init__(self, plan: FaultPlan, inner: HttpTransport | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(inner)
        self.plan = plan

    def send(self, request: Any, **kwargs: Any) -> Any:
        is_commit = request.method == "POST" and "$batch" in request.url

        def refused(fault: str) -> Any:
            if fault == "store_timeout":
                raise ServiceRequestError("injected: connection timed out")
            return status_response(request, 503)

        return self.plan.around(STORE_FAULTS if is_commit else STORE_FAULTS[:3],
                                lambda: self._inner.send(request, **kwargs), refused,
                                lambda: ServiceResponseError("injected: the response was lost after the server "
                                                             "applied the request"))  # fmt: skip


def status_response(request: Any, status: int) -> Any:
    """A response the server never sent, in the type the pipeline expects for ``request``:
    the SDK sends legacy transport requests, the lean transaction path azure.core.rest ones."""
    body = b'{"odata.error":{"code":"ServerBusy","message":{"value":"injected"}}}'
    headers = {"Content-Type": "application/json", "x-ms-error-code": "ServerBusy"}
    raw = requests.Response()
    raw.status_code = status
    raw.reason = "Service Unavailable (injected)"
    # a readable, closable body, as a real answer has (the pipeline streams and closes it)
    raw.raw = urllib3.HTTPResponse(body=io.BytesIO(body), status=status, headers=headers, preload_content=False)
    raw.headers.update(headers)
    raw.url = request.url
    if isinstance(request, RestHttpRequest):
        from azure.core.rest._requests_basic import RestRequestsTransportResponse  # what RequestsTransport returns

        response = RestRequestsTransportResponse(request=request, internal_response=raw)  # type: ignore[no-untyped-call]
        response.read()
        return response
    return RequestsTransportResponse(request, raw)


def _wrote(answer: Any) -> bool:
    """Whether a commit's answer says something was written: an HTTP answer of 2xx (a Table
    ``$batch`` answers 202 even when its changeset failed: counted as written), a store's
    ``commit_many`` a new commit among its results."""
    code = getattr(answer, "status_code", None)
    if isinstance(code, int):
        return 200 <= code < 300
    return any(str(getattr(result, "status", "")) == "new" for result in answer or ())


def faulty_calls(store: Any, plan: FaultPlan) -> Any:
    """The same faults on a store without a transport (``MemoryStore``): its commits meet every
    fault of ``STORE_FAULTS``, its reads the first three, as their requests would; each call takes
    ``plan.latency``. Returns the
    store as it was (a view without the faults, for the checks after a run)."""
    from shared.idempotency.errors import StoreUnavailable

    def refused(fault: str) -> Any:
        raise StoreUnavailable(f"injected: {fault}")

    def wrapped(call: Callable[..., Any], kinds: tuple[str, ...]) -> Callable[..., Any]:
        def answered(*args: Any, **kwargs: Any) -> Any:
            time.sleep(plan.latency)  # a round trip: other deliveries run meanwhile, as they do beside a real store
            return call(*args, **kwargs)

        return lambda *args, **kwargs: plan.around(
            kinds,
            lambda: answered(*args, **kwargs),
            refused,
            lambda: StoreUnavailable("injected: the response was lost after the store applied the call"),
        )

    faultless = copy.copy(store)  # shares its data; keeps its own methods
    store.commit_many = wrapped(store.commit_many, STORE_FAULTS)
    for name in ("read_current", "get", "insert"):  # the reads, and the pin of a key to its partition
        setattr(store, name, wrapped(getattr(store, name), STORE_FAULTS[:3]))
    return faultless
