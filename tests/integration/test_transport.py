"""The store's HTTP transports against a local server: connections kept per host above the
trigger's concurrency, azure-core's error classes for each way a request can fail, the
store's timeouts, and azure-core's retry policy working over the urllib3 transport."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from azure.core import PipelineClient
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import (
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest

from shared.idempotency.table_batch import TableTransactions
from shared.idempotency.transport import (
    DEFAULT_POOL,
    Urllib3Transport,
    pooled_transport,
    transaction_transport,
)

TRANSPORTS: dict[str, Callable[[], Any]] = {"urllib3": Urllib3Transport, "requests": pooled_transport}


class Server(ThreadingHTTPServer):
    """Answers by path; remembers each request's client port (one per connection)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.ports: list[int] = []
        self.statuses: list[int] = []  # what /status answers, in turn (then 200)
        self.release = threading.Event()
        self.gate: threading.Barrier | None = None
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a connection serves many requests
    server: Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.ports.append(self.client_address[1])
        if self.path == "/gate" and self.server.gate is not None:
            self.server.gate.wait(timeout=10)  # every caller holds a connection at once
        if self.path == "/held":
            self.server.release.wait(timeout=10)
        if self.path == "/drop":
            self.connection.shutdown(socket.SHUT_RDWR)  # no answer at all
            return
        status = 200
        if self.path.startswith("/status"):  # a transaction posts to <base>/$batch
            with self.server.lock:
                status = self.server.statuses.pop(0) if self.server.statuses else 200
        body = json.dumps({"path": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "0")
        self.send_header("X-Answer", "yes")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    threading.Thread(target=running.serve_forever, daemon=True).start()
    try:
        yield running
    finally:
        running.release.set()
        running.shutdown()
        running.server_close()


def post(transport: Any, url: str, **options: Any) -> Any:
    client: PipelineClient[HttpRequest, Any] = PipelineClient(url, transport=transport, **options)
    return client.send_request(HttpRequest("POST", url, content=b"{}"))


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_concurrent_calls_up_to_the_pool_size_reuse_their_connections(server: Server, kind: str) -> None:
    """16 calls at once (the trigger's default), three times over: 16 connections opened,
    then reused — requests' default pool (10) would open new ones every round."""
    concurrency, rounds = 16, 3
    transport = TRANSPORTS[kind]()
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(rounds):
            server.gate = threading.Barrier(concurrency)
            answers = list(pool.map(lambda _: post(transport, server.url + "/gate").status_code, range(concurrency)))
            assert answers == [200] * concurrency
    assert len(server.ports) == concurrency * rounds
    assert len(set(server.ports)) == concurrency
    assert concurrency <= DEFAULT_POOL


def test_the_urllib3_answer_is_a_whole_azure_core_response(server: Server) -> None:
    response = post(Urllib3Transport(), server.url + "/ok")
    assert (response.status_code, response.reason, response.content_type) == (200, "OK", "application/json")
    assert response.headers["x-answer"] == response.headers["X-ANSWER"] == "yes"  # case-insensitive
    assert response.json() == {"path": "/ok"} == json.loads(response.text()) == json.loads(response.read())
    assert b"".join(response.iter_bytes()) == response.content
    response.raise_for_status()
    server.statuses = [404]
    with pytest.raises(HttpResponseError) as refused:
        post(Urllib3Transport(), server.url + "/status").raise_for_status()
    assert refused.value.status_code == 404


def test_nothing_listening_is_a_request_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(ServiceRequestError):
            post(Urllib3Transport(), f"http://127.0.0.1:{port}/")


def test_a_connection_dropped_without_an_answer_is_a_response_error(server: Server) -> None:
    """The request may have been applied: the store treats it as transient, never as done."""
    with pytest.raises(ServiceResponseError):
        post(Urllib3Transport(), server.url + "/drop")


def test_the_read_timeout_applies(server: Server) -> None:
    with pytest.raises(ServiceResponseTimeoutError):
        post(Urllib3Transport(read_timeout=0.2), server.url + "/held")
    server.release.set()


def test_per_call_timeouts_override_the_transports(server: Server) -> None:
    client: PipelineClient[HttpRequest, Any] = PipelineClient(server.url, transport=Urllib3Transport())
    with pytest.raises(ServiceResponseTimeoutError):
        client.send_request(HttpRequest("POST", server.url + "/held", content=b""), read_timeout=0.2)
    server.release.set()


def test_streaming_and_unknown_options_are_refused(server: Server) -> None:
    request = HttpRequest("POST", server.url + "/ok", content=b"")
    with pytest.raises(ValueError, match="stream"):
        Urllib3Transport().send(request, stream=True)
    with pytest.raises(TypeError, match="connection_verify"):
        Urllib3Transport().send(request, connection_verify=False)


def test_throttled_transactions_are_retried_as_the_sdk_retries_them(server: Server) -> None:
    """azure-core's RetryPolicy over this transport: a POST answered 503 (or 500, 504) is
    retried, Retry-After honoured, then the last status raised with the operation's."""
    server.statuses = [503, 500, 504, 503]
    lean = TableTransactions(server.url + "/status", "t", AzureNamedKeyCredential("acct", "a2V5"),
                             retry_total=3, retry_backoff_factor=0.01)  # fmt: skip
    with pytest.raises(HttpResponseError) as refused:
        lean.submit([{"PartitionKey": "p", "RowKey": "r"}])
    assert refused.value.status_code == 503
    assert len(server.ports) == 4  # the first attempt and three retries
    assert server.statuses == []


def test_behind_a_proxy_the_requests_transport_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert isinstance(transaction_transport(), RequestsTransport)
    monkeypatch.delenv("HTTPS_PROXY")
    for name in ("HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(transaction_transport(), Urllib3Transport)
