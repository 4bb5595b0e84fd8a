"""A local HTTP server that answers every request with one canned answer (status, headers,
body): the service's recorded or crafted answers, fed to both store clients."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Canned(ThreadingHTTPServer):
    """Answers every request with ``answer``: (status, headers, body)."""

    answer: tuple[int, dict[str, str], bytes] = (500, {}, b"")
    received = 0  # requests answered so far


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the service: both clients pool their connections
    server: Canned

    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received += 1
        status, headers, body = self.server.answer
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = do_HEAD = answer

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def canned_server() -> Iterator[Canned]:
    server = Canned(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
