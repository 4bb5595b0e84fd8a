"""Table Storage entity-group transactions, encoded and decoded here, sent through a plain
azure-core pipeline (public APIs: PipelineClient, policies, ``azure.core.rest.HttpRequest``).

Why: in the Azure SDK a transaction costs ~4 ms fixed + ~0.5 ms per operation of client CPU
(multipart built with the ``email`` package, a thread pool per request), about five times
what the dedup flow itself costs. The wire format is the documented one ("Performing entity
group transactions", OData JSON, ``multipart/mixed``), the same bytes as the SDK's modulo
boundaries and ids (tests/integration/test_table_batch.py compares them); entities are
encoded by the SDK's type rules (``Edm.*`` annotations, Int32 range, UTC times). The shared
key (Azurite) or a ``TokenCredential`` (managed identity) authenticates, as the SDK's client
it is built from; retries are azure-core's, with the store's settings; the transport is
urllib3's connection pools (transport.py), requests' behind a proxy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from enum import Enum
from typing import Any
from urllib.parse import urlsplit
from xml.etree import ElementTree

from azure.core import PipelineClient
from azure.core.credentials import AzureNamedKeyCredential, TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceResponseError,
)
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import (
    BearerTokenCredentialPolicy,
    CustomHookPolicy,
    HeadersPolicy,
    RequestIdPolicy,
    RetryPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest
from azure.data.tables import TableErrorCode

from ._transport import transaction_transport

API_VERSION = "2019-02-02"  # what azure-data-tables 12.x sends
STORAGE_SCOPE = "https://storage.azure.com/.default"
_INT32 = range(-(2**31), 2**31)
_STATUS = re.compile(rb"^HTTP/1\.1 (\d{3})", re.MULTILINE)
_ERROR_CODE = re.compile(rb"^x-ms-error-code:[ \t]*(\S+)", re.MULTILINE | re.IGNORECASE)
# Refusals' classes by status. The SDK goes by code: ClientAuthenticationError for AuthenticationFailed and
# InvalidAuthenticationInfo only, so a missing role's 403 (AuthorizationPermissionMismatch) is a plain
# HttpResponseError there. Subclasses of it: an ``except`` written for the SDK's errors still catches these.
_REFUSALS: dict[int, type[HttpResponseError]] = {
    401: ClientAuthenticationError,
    403: ClientAuthenticationError,
    404: ResourceNotFoundError,
}


@dataclass(frozen=True)
class TransactionFailure:
    """An operation the service refused; the transaction wrote nothing. ``index`` is the
    failing operation's position as the service states it ("1:The specified entity…"),
    None when it did not."""

    index: int | None
    status: int
    code: str
    message: str

    @classmethod
    def of(cls, status: int, code: str, message: str) -> TransactionFailure:
        prefix, colon, _ = message.partition(":")
        return cls(int(prefix) if colon and prefix.isdigit() else None, status, code, message)

    @property
    def already_exists(self) -> bool:
        """An insert met an existing entity: what ``conflict`` reads, never an error."""
        return self.status == 409 and self.code == TableErrorCode.ENTITY_ALREADY_EXISTS


class SharedKeyPolicy(SansIOHTTPPolicy):  # type: ignore[type-arg]
    """Table service Shared Key authorization: HMAC-SHA256 over verb, Content-MD5,
    Content-Type, date and the canonicalized resource (/account/path)."""

    def __init__(self, credential: AzureNamedKeyCredential) -> None:
        self._credential = credential

    def on_request(self, request: PipelineRequest) -> None:  # type: ignore[type-arg]
        http = request.http_request
        now = formatdate(usegmt=True)
        http.headers["x-ms-date"] = now
        http.headers["Date"] = now
        name, key = self._credential.named_key
        signed = "\n".join([http.method, http.headers.get("Content-MD5", ""), http.headers.get("Content-Type", ""),
                            now, f"/{name}{urlsplit(http.url).path}"])  # fmt: skip
        digest = hmac.new(base64.b64decode(key), signed.encode(), hashlib.sha256).digest()
        http.headers["Authorization"] = f"SharedKey {name}:{base64.b64encode(digest).decode()}"


class TableTransactions:
    """``submit`` sends one entity-group transaction of inserts to ``table``."""

    def __init__(
        self,
        endpoint: str,
        table: str,
        credential: AzureNamedKeyCredential | TokenCredential,
        *,
        transport: HttpTransport | None = None,  # type: ignore[type-arg]
        raw_request_hook: Callable[[Any], None] | None = None,
        retry_total: int = 3,
        retry_backoff_factor: float = 0.4,
        retry_backoff_max: int = 4,
        connection_timeout: float = 5,
        read_timeout: float = 30,
    ) -> None:
        self._base = endpoint.rstrip("/")
        # One batch boundary per client: Azurite derives its response's boundary from it, and
        # Python's http.client compiles a regular expression per distinct response boundary
        # when it reads the headers (the Azure service may choose its own boundary). It cannot
        # be forged from inside a part: bodies are JSON, whose strings never hold a line break.
        self._boundary, self._changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
        self._table_url = f"{self._base}/{table}"
        self._timeouts: dict[str, Any] = {"connection_timeout": connection_timeout, "read_timeout": read_timeout}
        auth: SansIOHTTPPolicy | BearerTokenCredentialPolicy  # type: ignore[type-arg]
        if isinstance(credential, AzureNamedKeyCredential):
            auth = SharedKeyPolicy(credential)
        elif hasattr(credential, "get_token"):
            auth = BearerTokenCredentialPolicy(credential, STORAGE_SCOPE)
        else:
            raise ValueError(f"lean transactions take an account key or a token credential, not "
                             f"{type(credential).__name__}: set DEDUP_TABLE_TRANSACTIONS=sdk")  # fmt: skip
        headers = {"x-ms-version": API_VERSION, "DataServiceVersion": "3.0", "MaxDataServiceVersion": "3.0;NetFx",
                   "Accept": "application/json"}  # fmt: skip
        policies = [
            RequestIdPolicy(),
            HeadersPolicy(headers),
            UserAgentPolicy(sdk_moniker="idempotency-table-batch"),
            RetryPolicy(
                retry_total=retry_total, retry_backoff_factor=retry_backoff_factor, retry_backoff_max=retry_backoff_max
            ),
            auth,  # after the retry policy: every attempt is signed afresh
            CustomHookPolicy(raw_request_hook=raw_request_hook),
        ]
        self._client: PipelineClient[HttpRequest, Any] = PipelineClient(
            self._base, policies=policies, transport=transport or transaction_transport(**self._timeouts)
        )

    @classmethod
    def of(cls, service: Any, table: str, **options: Any) -> TableTransactions:
        """From a TableServiceClient: its endpoint and credential, nothing private."""
        return cls(service.url, table, service.credential, **options)

    def submit(self, operations: Sequence[Mapping[str, Any]], **options: Any) -> TransactionFailure | None:
        """Insert every entity (one PartitionKey) atomically. None when all were written;
        the failure when the service refused one (nothing written); other errors raise
        as the SDK's do (HttpResponseError with the status and the service's error_code).
        ``options``: per-request pipeline options, e.g. ``retry_total``."""
        body = encode(self._table_url, operations, self._boundary, self._changeset)
        request = HttpRequest("POST", f"{self._base}/$batch", content=body,
                              headers={"Content-Type": f"multipart/mixed; boundary={self._boundary}"})  # fmt: skip
        response = self._client.send_request(request, **{**self._timeouts, **options})
        if response.status_code != 202:
            code, message = _error_body(response.content.strip())
            raise _refused(response, response.status_code, response.headers.get("x-ms-error-code") or code, message)
        if not response.headers.get("Content-Type", "").startswith("multipart/mixed"):
            raise ServiceResponseError(f"a transaction was answered with {response.headers.get('Content-Type')!r}")
        failure = decode(response.content, len(operations))
        if failure is not None and not failure.already_exists:
            raise _refused(response, failure.status, failure.code, failure.message)  # the operation's status
        return failure

    def close(self) -> None:
        self._client.close()


# -- the wire format -----------------------------------------------------------------------


def encode(table_url: str, entities: Sequence[Mapping[str, Any]], batch: str, changeset: str) -> bytes:
    """The $batch body for inserts into ``table_url``, delimited by ``batch`` and ``changeset``."""
    now = formatdate(usegmt=True)
    # Every part's headers are the same but for its Content-ID and Content-Length.
    head = f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\nContent-ID: "
    request = f"\r\n\r\nPOST {table_url} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: "
    tail = (f"\r\nx-ms-version: {API_VERSION}\r\nDataServiceVersion: 3.0\r\n"
            f"Accept: application/json;odata=minimalmetadata\r\nx-ms-date: {now}\r\nDate: {now}\r\n\r\n")  # fmt: skip
    parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n".encode()]
    for index, entity in enumerate(entities):
        payload = json.dumps(entity_json(entity)).encode()
        parts += (f"{head}{index}{request}{len(payload)}{tail}".encode(), payload, b"\r\n")
    parts.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n".encode())
    return b"".join(parts)


def entity_json(entity: Mapping[str, Any]) -> dict[str, Any]:
    """An entity as the service's OData JSON, by the SDK's rules: strings, doubles, times,
    binary, GUIDs and Int64 annotated; ints outside Int32 refused; None left out."""
    found: dict[str, Any] = {}
    for name, value in entity.items():
        if type(value) is str:  # most properties: the common case first
            found[name], found[f"{name}@odata.type"] = value, "Edm.String"
            continue
        if isinstance(value, tuple):  # (value, EdmType) or EntityProperty: the type given
            typed, kind = value[0], str(getattr(value[1], "value", value[1]))
            if typed is not None:
                found[name], found[f"{name}@odata.type"] = _typed(name, typed, kind), kind
            continue
        if value is None:
            continue
        edm: str | None
        if isinstance(value, Enum | str):
            edm, value = "Edm.String", str(value)
        elif isinstance(value, bool):
            edm = None
        elif isinstance(value, int):
            if value not in _INT32:
                raise TypeError(f"{name}: {value} is too large to be cast to type Edm.Int32")
            edm = None
        elif isinstance(value, float):
            edm, value = "Edm.Double", _double(value)
        elif isinstance(value, datetime):
            edm = "Edm.DateTime"
            value = getattr(value, "tables_service_value", "") or _utc_text(value)
        elif isinstance(value, bytes):
            edm, value = "Edm.Binary", base64.b64encode(value).decode()
        elif isinstance(value, uuid.UUID):
            edm, value = "Edm.Guid", str(value)
        else:
            raise TypeError(f"{name}: {type(value).__name__} is not a Table property type")
        found[name] = value
        if edm:
            found[f"{name}@odata.type"] = edm
    return found


def _typed(name: str, value: Any, kind: str) -> Any:
    """A value under the type the caller named, as the SDK sends it."""
    if kind in ("Edm.Int64", "Edm.Int32"):
        bits = 64 if kind == "Edm.Int64" else 32
        if not -(2 ** (bits - 1)) <= int(value) < 2 ** (bits - 1):
            raise TypeError(f"{name}: {value} is too large to be cast to type {kind}")
        return str(value) if bits == 64 else int(value)
    if kind == "Edm.Double":
        return _double(value)
    if kind == "Edm.DateTime":
        return value if isinstance(value, str) else _utc_text(value)
    if kind == "Edm.Binary":
        return base64.b64encode(value).decode()
    if kind in ("Edm.String", "Edm.Guid"):
        return str(value)
    if kind == "Edm.Boolean":
        return value
    raise TypeError(f"{name}: {kind} is not a Table property type")


def _utc_text(value: datetime) -> str:
    """The SDK's form, ``%Y-%m-%dT%H:%M:%S.%fZ`` in UTC (isoformat: the same text, faster)."""
    if value.tzinfo is UTC:  # the store's own times: "+00:00" becomes "Z"
        return value.isoformat(timespec="microseconds")[:-6] + "Z"
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _double(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def decode(body: bytes, operations: int) -> TransactionFailure | None:
    """The changeset response: one 2xx answer per operation, or the one that failed (the
    service stops at the first failure and answers for it alone). Anything else — fewer
    answers, none, not a changeset — may or may not have been applied: ServiceResponseError,
    which the store treats as transient (the redelivery then finds what was written)."""
    statuses = [(int(match.group(1)), match.end()) for match in _STATUS.finditer(body)]
    for status, end in statuses:
        if not 200 <= status < 300:
            return TransactionFailure.of(status, *_error(body[end:]))
    if len(statuses) != operations:
        raise ServiceResponseError(f"a transaction of {operations} operations was answered {len(statuses)} times")
    return None


def _error(part: bytes) -> tuple[str, str]:
    """(code, message) of a changeset part's answer: its headers (x-ms-error-code first,
    as the service sends it), then its error body."""
    head, _, rest = part.partition(b"\r\n\r\n")
    code, message = _error_body((rest or part).split(b"\r\n--", 1)[0].strip())
    header = _ERROR_CODE.search(head) if rest else None
    return (header.group(1).decode("ascii", "replace") if header else code), message


def _error_body(body: bytes) -> tuple[str, str]:
    """(code, message) of an error body: OData JSON, or XML in either of the service's shapes
    (OData's namespaced ``<error>``, storage's ``<Error>`` whose other elements, such as
    AuthenticationErrorDetail, say why and join the message); else ("", the text)."""
    if body.startswith(b"<"):
        try:
            children = list(ElementTree.fromstring(body))
        except (ElementTree.ParseError, LookupError):  # LookupError: an unknown declared encoding
            children = []
        code, lines = "", list[str]()
        for child in children:
            name, text = child.tag.rpartition("}")[2], (child.text or "").strip()
            if name.lower() == "code":
                code = text
            elif name.lower() == "message":
                lines.insert(0, text)
            elif text:
                lines.append(f"{name}: {text}")
        if code or lines:
            return code, "\n".join(lines)
    try:
        error = json.loads(body)["odata.error"]
        return str(error.get("code", "")), str(error.get("message", {}).get("value", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", body[:500].decode("utf-8", "replace")


def _refused(response: Any, status: int, code: str, message: str) -> HttpResponseError:
    """The error for a refusal, as the SDK's: its class by status, ``status_code`` and the
    service's ``error_code`` (None when it gave none)."""
    text = message or f"Operation returned an invalid status {status}"  # azure-core's words, a part's status
    error = _REFUSALS.get(status, HttpResponseError)(message=f"{code}: {text}" if code else text, response=response)
    error.status_code = status  # a part's own, not the 202 around it
    error.error_code = code or None  # type: ignore[attr-defined]  # the SDK's errors carry it undeclared
    return error
