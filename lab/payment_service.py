"""A local payment API on loopback that honours ``Idempotency-Key`` (IETF httpapi draft):
the first response is returned again for a repeated key (``Idempotent-Replayed: true``),
409 while the first request with that key is still being processed, 422 when a key is
reused with another body. It records every charge it accepted: the ground truth for
"one accepted charge per order"."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class _Entry:
    body_hash: str
    response: tuple[int, dict[str, Any]] | None = None  # None while in flight


@dataclass
class PaymentService:
    # Called with (idempotency key, phase) at "before" and "after" the charge: tests use
    # it to stall a request or inject a fault ("fail" → 503, "drop" → no response).
    hook: Callable[[str, str], str | None] | None = None
    accepted: list[dict[str, Any]] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._mutex = threading.Lock()
        self._keys: dict[str, _Entry] = {}
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the service first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def charges_per(self, field: str) -> dict[str, int]:
        """How many charges it accepted per value of the charges' ``field`` (``orderId``)."""
        with self._mutex:
            return dict(Counter(str(charge[field]) for charge in self.accepted))

    def start(self) -> PaymentService:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                service._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="payments").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> PaymentService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        raw = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        key = request.headers.get("Idempotency-Key")
        if request.path != "/charges":
            return _reply(request, 404, {"title": "not found"})
        if not key:
            return _reply(request, 400, {"title": "Idempotency-Key header is required"})
        body_hash = hashlib.sha256(raw).hexdigest()
        with self._mutex:
            self.requests[key] += 1
            entry = self._keys.get(key)
            if entry is None:
                entry = self._keys[key] = _Entry(body_hash)
            elif entry.body_hash != body_hash:
                return _reply(request, 422, {"title": "Idempotency-Key reused with another request"})
            elif entry.response is None:
                return _reply(request, 409, {"title": "a request with this key is in progress"})
            else:
                return _reply(request, *entry.response, replayed=True)
        fault = self._fault(key, "before")
        if fault == "fail":
            with self._mutex:
                del self._keys[key]  # nothing was charged: the key may be used again
            return _reply(request, 503, {"title": "unavailable (injected)"})
        if fault == "decline":  # final: the key keeps this answer
            declined = (402, {"title": "card declined", "detail": "issuer said no (ref 7781)"})
            with self._mutex:
                entry.response = declined
            return _reply(request, *declined)
        charge = {"id": f"ch_{next(self._ids)}", **json.loads(raw)}
        with self._mutex:
            self.accepted.append(charge)
            entry.response = (201, charge)
        if self._fault(key, "after") == "drop":
            request.close_connection = True
            return  # charged, but the caller never hears back
        _reply(request, 201, charge)

    def _fault(self, key: str, phase: str) -> str | None:
        return self.hook(key, phase) if self.hook else None


def _reply(request: BaseHTTPRequestHandler, status: int, body: dict[str, Any], *, replayed: bool = False) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json" if status < 400 else "application/problem+json")
    request.send_header("Content-Length", str(len(data)))
    if replayed:
        request.send_header("Idempotent-Replayed", "true")
    request.end_headers()
    request.wfile.write(data)
