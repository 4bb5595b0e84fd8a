"""HTTP transports for the store's clients, each with more connections per host than the
trigger has concurrent calls (requests' default is 10, the Service Bus trigger's 16).

- ``pooled_transport()``: the Azure SDK clients' transport (requests), as azure-core's own.
- ``Urllib3Transport``: the lean transaction path's, on urllib3's connection pools through
  azure-core's public transport interface. A commit is one short POST answered in full;
  requests' session layer (settings merged, the request prepared, cookies, hooks, a
  response object rebuilt) cost about as much client CPU as urllib3 itself.
- ``transaction_transport()``: the latter, unless the environment names a proxy (requests
  honours proxy settings and their exclusions; this transport does not).

Timeouts and retries are the caller's: azure-core's RetryPolicy retries, never urllib3.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator, MutableMapping
from typing import Any
from urllib.request import getproxies

import certifi
import requests
import urllib3
from azure.core.exceptions import (
    HttpResponseError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import HttpTransport, RequestsTransport
from azure.core.rest import HttpRequest, HttpResponse
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError, SSLError
from urllib3.util.retry import Retry

DEFAULT_POOL = 32  # connections per host: above the trigger's 16 concurrent calls


def _ca_bundle() -> str | None:
    """The CA bundle requests would use when told to (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE)."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")


def pooled_transport(
    pool: int = DEFAULT_POOL, *, connection_timeout: float = 5, read_timeout: float = 30
) -> RequestsTransport:
    """A requests session keeping up to ``pool`` connections per host, without urllib3
    retries. When the environment sets no proxy, requests is told not to scan the whole
    environment for one on every request; a CA bundle it names still applies."""
    session = requests.Session()
    no_retries = Retry(total=False, redirect=False, raise_on_status=False)
    adapter = requests.adapters.HTTPAdapter(pool_connections=pool, pool_maxsize=pool, max_retries=no_retries)
    for scheme in ("http://", "https://"):
        session.mount(scheme, adapter)
    # A transport passed to an SDK client brings its own timeouts (the client's options no longer apply).
    options: dict[str, Any] = {"session": session, "connection_timeout": connection_timeout,
                               "read_timeout": read_timeout}  # fmt: skip
    if getproxies():
        return RequestsTransport(**options)
    session.trust_env = False
    bundle = _ca_bundle()
    return RequestsTransport(**options, **({"connection_verify": bundle} if bundle else {}))


def transaction_transport(
    pool: int = DEFAULT_POOL, *, connection_timeout: float = 5, read_timeout: float = 30
) -> HttpTransport:  # type: ignore[type-arg]
    """The lean path's transport: urllib3, or requests behind a proxy."""
    if getproxies():
        return pooled_transport(pool, connection_timeout=connection_timeout, read_timeout=read_timeout)  # type: ignore[no-any-return]
    return Urllib3Transport(pool, connection_timeout=connection_timeout, read_timeout=read_timeout)


class Urllib3Transport(HttpTransport):  # type: ignore[type-arg]
    """Sends ``azure.core.rest.HttpRequest``s with bytes bodies and answers each with its
    whole body read. Errors map to azure-core's as its requests transport maps them:
    nothing sent → ServiceRequestError, the answer lost → ServiceResponseError."""

    def __init__(self, pool: int = DEFAULT_POOL, *, connection_timeout: float = 5, read_timeout: float = 30) -> None:
        self._timeout = urllib3.Timeout(connect=connection_timeout, read=read_timeout)
        bundle = _ca_bundle() or certifi.where()
        trust: dict[str, Any] = {"ca_cert_dir" if os.path.isdir(bundle) else "ca_certs": bundle}  # as requests takes it
        self._pools = urllib3.PoolManager(maxsize=pool, retries=False, timeout=self._timeout, **trust)

    def send(self, request: HttpRequest, **options: Any) -> HttpResponse:
        connect, read = options.pop("connection_timeout", None), options.pop("read_timeout", None)
        if options.pop("stream", False):
            raise ValueError("Urllib3Transport reads every answer whole: stream=True is not supported")
        if options:
            raise TypeError(f"Urllib3Transport: unsupported options {sorted(options)}")
        if not isinstance(request, HttpRequest):
            raise TypeError("Urllib3Transport sends azure.core.rest.HttpRequest only")
        timeout = self._timeout
        if connect is not None or read is not None:
            timeout = urllib3.Timeout(connect=self._timeout.connect_timeout if connect is None else connect,
                                      read=self._timeout.read_timeout if read is None else read)  # fmt: skip
        try:
            answer = self._pools.urlopen(request.method, request.url, body=request.content, headers=request.headers,
                                         retries=False, redirect=False, timeout=timeout)  # fmt: skip
        except ConnectTimeoutError as exc:
            # NewConnectionError is a ConnectTimeoutError to urllib3: refused is not timed out
            kind = ServiceRequestError if isinstance(exc, NewConnectionError) else ServiceRequestTimeoutError
            raise kind(exc, error=exc) from exc
        except SSLError as exc:
            # A certificate refused: nothing was sent. Any other TLS failure may come after
            # the request went out (while reading the answer): it may have been applied.
            refused = any(isinstance(cause, ssl.SSLCertVerificationError) for cause in (*exc.args, exc.__context__))
            raise (ServiceRequestError if refused else ServiceResponseError)(exc, error=exc) from exc
        except ReadTimeoutError as exc:
            raise ServiceResponseTimeoutError(exc, error=exc) from exc
        except urllib3.exceptions.HTTPError as exc:  # reset, protocol error, short body
            raise ServiceResponseError(exc, error=exc) from exc
        return _Response(request, answer)

    def open(self) -> None:
        """Connections open on demand."""

    def __exit__(self, *args: Any) -> None:
        self.close()

    def close(self) -> None:
        self._pools.clear()


class _Response(HttpResponse):
    """An answer read whole: azure.core.rest.HttpResponse over urllib3's."""

    def __init__(self, request: HttpRequest, answer: urllib3.BaseHTTPResponse) -> None:
        self._request = request
        self._answer = answer
        self._content = answer.data
        self._encoding: str | None = None

    @property
    def request(self) -> HttpRequest:
        return self._request

    @property
    def status_code(self) -> int:
        return self._answer.status

    @property
    def headers(self) -> MutableMapping[str, str]:
        return self._answer.headers  # case-insensitive, as the interface requires

    @property
    def reason(self) -> str:
        return self._answer.reason or ""

    @property
    def content_type(self) -> str | None:
        return self._answer.headers.get("Content-Type")

    @property
    def is_closed(self) -> bool:
        return True

    @property
    def is_stream_consumed(self) -> bool:
        return True

    @property
    def encoding(self) -> str | None:
        return self._encoding

    @encoding.setter
    def encoding(self, value: str | None) -> None:
        self._encoding = value

    @property
    def url(self) -> str:
        return self._request.url

    @property
    def content(self) -> bytes:
        return self._content

    def text(self, encoding: str | None = None) -> str:
        return self._content.decode(encoding or self._encoding or "utf-8-sig", "replace")  # as azure-core

    def json(self) -> Any:
        return json.loads(self._content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HttpResponseError(response=self)

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()

    def close(self) -> None:
        """The connection went back to its pool when the body was read."""

    def read(self) -> bytes:
        return self._content

    def iter_raw(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content

    def iter_bytes(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content
