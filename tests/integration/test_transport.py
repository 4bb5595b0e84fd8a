"""The store's HTTP transports against a local server: connections kept per host above the
trigger's concurrency, azure-core's error classes for each way a request can fail, the
store's timeouts, and azure-core's retry policy working over the urllib3 transport."""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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

from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._transport import (
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
        self.retry_after: str | None = None  # sent with every answer when set
        self.release = threading.Event()
        self.gate: threading.Barrier | None = None
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or reset on purpose (what these tests do) breaks the pipe
        of the answer being written: expected, not noise on stderr. Anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


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
        if self.path == "/short":  # the answer cut short: fewer bytes than announced
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status = 200
        if self.path.startswith("/status"):  # a transaction posts to <base>/$batch
            with self.server.lock:
                status = self.server.statuses.pop(0) if self.server.statuses else 200
        body = json.dumps({"path": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.server.retry_after is not None:
            self.send_header("Retry-After", self.server.retry_after)
        self.send_header("X-Answer", "yes")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 must not go to a proxy the environment names (nor switch transports)."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


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
        with pytest.raises(ServiceRequestError) as refused:
            post(Urllib3Transport(), f"http://127.0.0.1:{port}/")
    assert type(refused.value) is ServiceRequestError  # refused, not timed out


@pytest.mark.parametrize("path", ["/drop", "/short"])
def test_an_answer_lost_or_cut_short_is_a_response_error(server: Server, path: str) -> None:
    """The request may have been applied: the store treats it as transient, never as done."""
    with pytest.raises(ServiceResponseError) as lost:
        post(Urllib3Transport(), server.url + path)
    assert type(lost.value) is ServiceResponseError


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


class Sleepless(Urllib3Transport):
    """Records the pauses azure-core's retry policy asks for instead of taking them."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def sleep(self, duration: float) -> None:
        self.pauses.append(duration)


def lean_to(server: Server, transport: Urllib3Transport) -> TableTransactions:
    key = AzureNamedKeyCredential("acct", "a2V5")
    return TableTransactions(server.url + "/status", "t", key, transport=transport, retry_total=3)


@pytest.mark.parametrize("statuses", [[503, 500, 504, 503], [500, 500, 500, 500]])
def test_throttled_transactions_are_retried_as_the_sdk_retries_them(server: Server, statuses: list[int]) -> None:
    """azure-core's RetryPolicy over this transport: a POST answered 500, 503 or 504 is
    retried three times with backoff, then the last status is raised."""
    server.statuses = list(statuses)
    transport = Sleepless()
    with pytest.raises(HttpResponseError) as refused:
        lean_to(server, transport).submit([{"PartitionKey": "p", "RowKey": "r"}])
    assert refused.value.status_code == statuses[-1]
    assert (len(server.ports), server.statuses) == (4, [])  # the first attempt and three retries
    # azure-core's schedule with the store's backoff factor (0.4 s): at once, then 0.8 s, 1.6 s
    assert transport.pauses == [0.8, 1.6]


def test_retry_after_is_honoured(server: Server) -> None:
    server.statuses, server.retry_after = [503], "7"
    transport = Sleepless()
    with pytest.raises(HttpResponseError):  # 200 is not a changeset: the retry itself got through
        lean_to(server, transport).submit([{"PartitionKey": "p", "RowKey": "r"}])
    assert (len(server.ports), transport.pauses) == (2, [7.0])


def test_other_refusals_are_not_retried(server: Server) -> None:
    server.statuses = [404]
    transport = Sleepless()
    with pytest.raises(HttpResponseError) as refused:
        lean_to(server, transport).submit([{"PartitionKey": "p", "RowKey": "r"}])
    assert (refused.value.status_code, len(server.ports), transport.pauses) == (404, 1, [])


def test_a_certificate_the_client_does_not_trust_is_a_request_error(tmp_path: Path) -> None:
    """TLS verification is on: a self-signed server is refused before anything is sent."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + timedelta(hours=1))
                   .sign(key, hashes.SHA256()))  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    running = Server()
    running.socket = tls.wrap_socket(running.socket, server_side=True)
    threading.Thread(target=running.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServiceRequestError) as refused:
            post(Urllib3Transport(), f"https://127.0.0.1:{running.server_port}/ok")
        assert type(refused.value) is ServiceRequestError
        assert running.ports == []  # nothing reached the handler
    finally:
        running.shutdown()
        running.server_close()


def test_behind_a_proxy_the_requests_transport_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(transaction_transport(), Urllib3Transport)  # no proxy (the autouse fixture)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert isinstance(transaction_transport(), RequestsTransport)
