"""Calling a service from a step: every request carries the step's ``Idempotency-Key``
header, so a retry or a takeover that repeats the call is absorbed downstream."""

from __future__ import annotations

from typing import Any

import requests

from .errors import DownstreamRejected, DownstreamUnavailable

# 409: the service still works on this key (IETF httpapi idempotency-key draft); retry.
RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT = 10.0  # seconds; DEDUP_LEASE must outlive it (make check-leases)


class IdempotentHttp:
    def __init__(
        self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT, session: requests.Session | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = session or requests.Session()

    def post(self, path: str, body: Any, idempotency_key: str) -> Any:
        try:
            response = self._session.post(
                self.base_url + path,
                json=body,
                headers={"Idempotency-Key": idempotency_key},
                timeout=self.timeout,
            )
        except requests.RequestException as exc:  # connection refused, reset, timeout
            raise DownstreamUnavailable(f"POST {path}: {exc}") from exc
        if response.status_code in RETRYABLE:
            raise DownstreamUnavailable(f"POST {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise DownstreamRejected(response.status_code, response.text[:500])
        return response.json()
