"""Table Storage entity-group transactions (inserts, conditional replaces and deletes) and
single inserts, encoded and decoded here, sent through a plain azure-core pipeline (public
APIs: PipelineClient, policies, ``azure.core.rest.HttpRequest``).

Why: in the Azure SDK a transaction costs ~4 ms fixed + ~0.5 ms per operation of client CPU
(multipart built with the ``email`` package, a thread pool per request), about five times
what the dedup flow itself costs. The wire format is the documented one ("Performing entity
group transactions", OData JSON, ``multipart/mixed``), the same bytes as the SDK's modulo
boundaries and ids (tests/integration/test_table_batch.py compares them); entities are
encoded by the SDK's type rules (``Edm.*`` annotations, Int32 range, UTC times). Answers are
read as the SDK reads them, each refusal returned or raised as the store gets it from the SDK
(tests/integration/test_table_batch_parity.py feeds both the same answers); ``check_changeset``
gives the SDK's clients this path's reading of a 202 that is not a whole changeset. The shared
key (Azurite) or a ``TokenCredential`` (managed identity) authenticates, as the SDK's client
it is built from; retries are azure-core's, with the store's settings; the transport is
urllib3's connection pools (_transport.py), requests' behind a proxy.
"""

from __future__ import annotations

import base64
import copy
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
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

from azure.core import MatchConditions, PipelineClient
from azure.core.credentials import AzureNamedKeyCredential, TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
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
from azure.data.tables import (
    RequestTooLargeError,
    TableClient,
    TableEntity,
    TableErrorCode,
    TableTransactionError,
    UpdateMode,
)

from ._table_query import INT32, Row, row_of, substituted
from ._transport import transaction_transport

API_VERSION = "2019-02-02"  # what azure-data-tables 12.x sends
STORAGE_SCOPE = "https://storage.azure.com/.default"
_ERROR_CODE = re.compile(rb"^x-ms-error-code:[ \t]*(\S+)", re.MULTILINE | re.IGNORECASE)
# Each answer's status line and headers, after a line break: a literal the engine finds at once,
# where ``^`` in MULTILINE mode is tried at every position (four times slower on a changeset).
_STATUS = re.compile(rb"\nHTTP/1\.1 (\d{3})")
_CONTENT_ID = re.compile(rb"\ncontent-id:[ \t]*(\d+)[ \t]*(?:\r|\n|$)")
# Where a part's headers end, and its body: CRLF, or LF alone (Cosmos DB's Table API answers so).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_BOUNDARY = re.compile(rb"\r?\n--")
_OPERATION = b"\r\nContent-Transfer-Encoding: binary\r\n"  # once per operation of a request (JSON escapes CR LF)
# An operation as TableClient.submit_transaction takes it: ("create", entity), ("update", entity,
# {"mode": UpdateMode.REPLACE, "etag": …, "match_condition": …}), ("delete", entity[, {"etag": …, …}]);
# or a bare entity, an insert.
Operation = Mapping[str, Any] | tuple[Any, ...]
# azure-core's RetryPolicy resends these methods after a timeout or a lost answer; a POST (every
# transaction) only when its options say so: see ``resendable``.
_RESEND_ALSO_POST = frozenset({"HEAD", "GET", "PUT", "DELETE", "OPTIONS", "TRACE", "POST"})
# A refusal of the whole request: its class by code, as the SDK's (_decode_error). The SDK's is a plain
# HttpResponseError for a 401/403 of another code (a missing role's AuthorizationPermissionMismatch); this
# path's, ClientAuthenticationError, a subclass: an ``except`` written for the SDK's errors still catches it.
_BY_CODE: dict[str, type[HttpResponseError]] = {
    **dict.fromkeys(["ConditionNotMet", "UpdateConditionNotSatisfied"], ResourceModifiedError),
    **dict.fromkeys(["InvalidAuthenticationInfo", "AuthenticationFailed"], ClientAuthenticationError),
    **dict.fromkeys(["ResourceNotFound", "TableNotFound", "EntityNotFound"], ResourceNotFoundError),
    **dict.fromkeys(["ResourceAlreadyExists", "TableAlreadyExists", "AccountAlreadyExists", "EntityAlreadyExists"],
                    ResourceExistsError),
}  # fmt: skip


def operation_kind(kind: Any) -> str:
    """An operation's kind as written ("create", "update", "upsert", "delete"): a string or the
    SDK's TransactionOperation, in any case."""
    return str(getattr(kind, "value", kind)).lower()


def resendable(operations: Sequence[Operation]) -> dict[str, Any]:
    """The pipeline options for a transaction of upserts alone: the retry policy may resend it
    after a timeout or a lost answer, as it resends a PUT, since an upsert applied twice leaves
    what it left once (a dead letter, the outbox's parked keys, a cursor). Other transactions are
    resent after a refusal that applied nothing (503) only: a create or a conditional write
    would read its own first attempt as a conflict, and its caller decides (reads it back)."""
    kinds = {operation_kind(op[0]) if isinstance(op, tuple) else "create" for op in operations}
    return {"retry_on_methods": _RESEND_ALSO_POST} if kinds == {"upsert"} else {}


class TransactionAuthenticationError(TableTransactionError, ClientAuthenticationError):
    """An operation of a changeset refused 401/403: the SDK's TableTransactionError, and an
    authentication error."""


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

    @property
    def version_conflict(self) -> bool:
        """An update or delete whose ETag no longer matched the entity's (412
        UpdateConditionNotSatisfied): another writer changed or deleted it first."""
        return self.status == 412 and self.code == TableErrorCode.UPDATE_CONDITION_NOT_SATISFIED

    @property
    def not_found(self) -> bool:
        """An update or delete of an entity that does not exist (404 ResourceNotFound; a
        missing table is TableNotFound, and raises)."""
        return self.status == 404 and self.code == TableErrorCode.RESOURCE_NOT_FOUND

    @property
    def decided(self) -> bool:
        """Returned for the caller to decide on (any other refusal raises): what the store reads
        from the SDK's TableTransactionError too, whatever the operation at ``index``."""
        return self.already_exists or self.version_conflict or self.not_found

    def decided_for(self, operations: Sequence[Operation]) -> bool:
        """``decided``, but a "not found" of a write that creates (an insert, an upsert: at its
        index, or every operation when the service named none): no entity was missing, the table
        was — Cosmos DB's Table API answers a missing table so (404 ResourceNotFound, where Table
        Storage says TableNotFound) — and it raises as a missing table does."""
        if not self.not_found:
            return self.decided
        kinds = [operation_kind(op[0]) if isinstance(op, tuple) else "create" for op in operations]
        named = [kinds[self.index]] if self.index is not None and 0 <= self.index < len(kinds) else kinds
        return not all(kind in ("create", "upsert") for kind in named)


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
    """Writes to ``table``: ``submit`` sends one entity-group transaction (inserts, replaces
    and deletes, conditional on an ETag or not) and returns each operation's new ETag, or the
    refusal the caller decides on; ``insert`` writes one entity and returns its ETag, None when
    it already existed. Other refusals raise as the SDK's do."""

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

    def submit(self, operations: Sequence[Operation], **options: Any) -> list[str] | TransactionFailure:
        """Apply every operation (one PartitionKey) atomically. Operations are the tuples
        ``TableClient.submit_transaction`` takes — ``("create", entity)``; ``("update", entity,
        {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified})``,
        without etag and match_condition ``If-Match: *``; ``("upsert", entity, {"mode":
        UpdateMode.REPLACE})``, insert or replace; ``("delete", entity[, {"etag": …,
        "match_condition": …}])`` — or a bare entity, an insert. Merges and other options raise
        ValueError, before anything is sent.

        All applied: each operation's new ETag, in the operations' order ("" for a delete).
        Refused, nothing written: the TransactionFailure when the caller decides on it
        (``decided``) — an insert met an existing entity (``already_exists``), an ETag no longer
        matched (``version_conflict``), an update or delete found no entity (``not_found``);
        ``index`` is the refused operation's, as the service states it. Any other refusal raises
        the SDK's class with the status and the service's error_code: TableTransactionError for
        an operation of the changeset (RequestTooLargeError for a 413), the class by code for
        the whole request. ``options``: per-request pipeline options, e.g. ``retry_total``."""
        body = encode(self._table_url, operations, self._boundary, self._changeset)
        request = HttpRequest("POST", f"{self._base}/$batch", content=body,
                              headers={"Content-Type": f"multipart/mixed; boundary={self._boundary}"})  # fmt: skip
        response = self._client.send_request(request, **{**self._timeouts, **resendable(operations), **options})
        if response.status_code != 202:
            code, message = _error_body(response.content.strip())
            too_large = RequestTooLargeError if response.status_code == 413 else None
            raise _refused(response, response.status_code, response.headers.get("x-ms-error-code") or code, message,
                           too_large)  # fmt: skip
        if not response.headers.get("Content-Type", "").startswith("multipart/mixed"):
            raise ServiceResponseError(f"a transaction was answered with {response.headers.get('Content-Type')!r}")
        answer = decode(response.content, len(operations))
        if isinstance(answer, TransactionFailure) and not answer.decided_for(operations):  # the SDK's class
            kind = {413: RequestTooLargeError, 401: TransactionAuthenticationError, 403: TransactionAuthenticationError}
            raise _refused(response, answer.status, answer.code, answer.message,
                           kind.get(answer.status, TableTransactionError))  # fmt: skip
        return answer

    def insert(self, entity: Mapping[str, Any], **options: Any) -> str | None:
        """Insert one entity (not a transaction: one POST to the table, answered without
        content). Its new ETag; None when an entity with its keys already exists (409
        EntityAlreadyExists). Other refusals raise as the SDK's do (HttpResponseError
        subclasses with the status and the service's error_code). ``options``: per-request
        pipeline options, e.g. ``retry_total`` — a retried insert whose first attempt was
        applied but unanswered reads None: the caller reads the entity back."""
        body = json.dumps(entity_json(entity)).encode()
        request = HttpRequest("POST", self._table_url, content=body,
                              headers={"Content-Type": "application/json;odata=nometadata",
                                       "Prefer": "return-no-content"})  # fmt: skip
        response = self._client.send_request(request, **{**self._timeouts, **options})
        if response.status_code in (201, 204):
            return str(response.headers.get("ETag", ""))
        code, message = _error_body(response.content.strip())
        code = response.headers.get("x-ms-error-code") or code
        if response.status_code == 409 and code == TableErrorCode.ENTITY_ALREADY_EXISTS:
            return None
        raise _refused(response, response.status_code, code, message)

    def query(self, query_filter: str, parameters: Mapping[str, str], limit: int) -> list[Row]:
        """The first ``limit`` rows ``query_filter`` matches, its ``@name`` parameters substituted
        as the SDK's ``query_entities`` substitutes text (``_table_query``), a page of up to 1,000
        rows a request; refusals raise as the SDK's do."""
        params = {"$format": "application/json;odata=minimalmetadata", "$top": str(min(limit, 1000)),
                  "$filter": substituted(query_filter, parameters)}  # fmt: skip
        rows: list[Row] = []
        while True:
            query = "&".join(f"{name}={quote(value, safe='')}" for name, value in params.items())  # keys hold "%"
            response = self._client.send_request(HttpRequest("GET", f"{self._table_url}()?{query}"), **self._timeouts)
            if response.status_code != 200:
                code, message = _error_body(response.content.strip())
                raise _refused(response, response.status_code, response.headers.get("x-ms-error-code") or code, message)
            rows += [row_of(entry) for entry in json.loads(response.content)["value"]]
            following = {name: response.headers.get(f"x-ms-continuation-{name}")
                         for name in ("NextPartitionKey", "NextRowKey")}  # fmt: skip
            if len(rows) >= limit or not any(following.values()):
                return rows[:limit]
            params = {**{k: v for k, v in params.items() if not k.startswith("Next")},
                      **{name: value for name, value in following.items() if value}}  # fmt: skip

    def sibling(self, table: TableClient) -> TableTransactions:
        """The same client (pipeline, connections) on another table of the account."""
        other = copy.copy(self)
        other._table_url = f"{self._base}/{table.table_name}"
        return other

    def close(self) -> None:
        self._client.close()


# -- the wire format -----------------------------------------------------------------------


def encode(table_url: str, operations: Sequence[Operation], batch: str, changeset: str) -> bytes:
    """The $batch body for ``operations`` on ``table_url``, delimited by ``batch`` and
    ``changeset``: each part as the SDK writes it (its headers in its order, If-Match as
    it quotes an ETag, keys quoted in the URL as it quotes them)."""
    now = formatdate(usegmt=True)
    # Every insert's headers are the same but for its Content-ID and Content-Length.
    head = f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\nContent-ID: "
    request = f"\r\n\r\nPOST {table_url} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: "
    common = f"\r\nx-ms-version: {API_VERSION}\r\nDataServiceVersion: 3.0\r\nAccept: application/json"
    dates = f"\r\nx-ms-date: {now}\r\nDate: {now}\r\n\r\n"
    tail = f"{common};odata=minimalmetadata{dates}"
    parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n".encode()]
    for index, operation in enumerate(operations):
        if isinstance(operation, Mapping):  # an insert, the common case first
            kind, entity, if_match = "create", operation, ""
        else:
            kind, entity, if_match = _operation(operation)
        if kind == "create":
            payload = json.dumps(entity_json(entity)).encode()
            parts += (f"{head}{index}{request}{len(payload)}{tail}".encode(), payload, b"\r\n")
        elif kind in ("update", "upsert"):  # a replace; an upsert (insert or replace) without If-Match
            payload = json.dumps(entity_json(entity)).encode()
            condition = f"\r\nIf-Match: {if_match}" if if_match else ""
            parts += (f"{head}{index}\r\n\r\nPUT {_entity_url(table_url, entity)} HTTP/1.1\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(payload)}{common}{condition}"
                      f"{dates}".encode(), payload, b"\r\n")  # fmt: skip
        else:
            parts.append(f"{head}{index}\r\n\r\nDELETE {_entity_url(table_url, entity)} HTTP/1.1{common};"
                         f"odata=minimalmetadata\r\nIf-Match: {if_match}{dates}\r\n".encode())  # fmt: skip
    parts.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n".encode())
    return b"".join(parts)


def _operation(operation: tuple[Any, ...]) -> tuple[str, Mapping[str, Any], str]:
    """(kind, entity, If-Match) of an operation tuple, checked as the SDK's
    TableBatchOperations checks it (its ValueErrors, its words), less what this path
    does not send: merges, other per-operation options."""
    if len(operation) not in (2, 3):
        raise TypeError("an operation is (kind, entity) or (kind, entity, options), as submit_transaction takes it")
    kind = operation_kind(operation[0])
    entity: Mapping[str, Any] = operation[1]
    options = dict(operation[2]) if len(operation) == 3 else {}
    if kind not in ("create", "update", "upsert", "delete"):
        raise ValueError(f"Unrecognized operation: {operation[0]}")
    if "PartitionKey" not in entity or "RowKey" not in entity:
        raise ValueError("PartitionKey and/or RowKey were not provided in entity")
    if kind in ("update", "upsert"):
        mode = options.pop("mode", UpdateMode.MERGE)  # the SDK's default
        if mode != UpdateMode.REPLACE:
            raise ValueError(f"{kind} mode {mode!r} is not sent by lean transactions: UpdateMode.REPLACE only")
    if_match = ""
    if kind in ("update", "delete"):
        etag, condition = options.pop("etag", None), options.pop("match_condition", None)
        if condition and not etag and isinstance(entity, TableEntity):  # as the SDK: the entity's own ETag
            etag = entity.metadata.get("etag")
        if_match = _if_match(etag, condition)
    if options:
        raise ValueError(f"{kind} options {sorted(options)} are not sent by lean transactions")
    return kind, entity, if_match


def _if_match(etag: str | None, condition: MatchConditions | None) -> str:
    """The If-Match header, by the SDK's rules (_get_match_condition, prep_if_match,
    quote_etag): the ETag when IfNotModified, ``*`` when unconditional."""
    condition = condition or MatchConditions.Unconditionally
    if condition == MatchConditions.IfNotModified:
        if not etag:
            raise ValueError("IfNotModified must be specified with etag.")
        if "\r" in etag or "\n" in etag:
            raise ValueError(f"not an ETag: {etag!r}")  # it would end the part's header
        if etag == "*" or etag.startswith("W/") or (etag.startswith(('"', "'")) and etag.endswith(etag[0])):
            return etag
        return f'"{etag}"'
    if condition == MatchConditions.Unconditionally:
        if etag:
            raise ValueError("Etag is not supported for an Unconditional operation.")
        return "*"
    raise ValueError(f"Unsupported match condition: {condition}")


def _entity_url(table_url: str, entity: Mapping[str, Any]) -> str:
    """``table(PartitionKey='…',RowKey='…')``: quotes doubled, then percent-encoded (the SDK's
    _prepare_key, then its URL serializer's ``quote(…, safe="")``)."""
    return f"{table_url}(PartitionKey='{_key(entity['PartitionKey'])}',RowKey='{_key(entity['RowKey'])}')"


def _key(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("PartitionKey or RowKey must be of type string.")
    return quote(value.replace("'", "''"), safe="")


def entity_json(entity: Mapping[str, Any]) -> dict[str, Any]:
    """An entity as the service's OData JSON, by the SDK's rules: strings, doubles, times,
    binary, GUIDs and Int64 annotated; ints outside Int32 refused; None left out."""
    found: dict[str, Any] = {}
    for name, value in entity.items():
        if type(value) is str:  # most properties: the common cases first
            found[name], found[f"{name}@odata.type"] = value, "Edm.String"
            continue
        if type(value) is datetime:  # every marker's times (a subclass may carry the service's own text)
            found[name], found[f"{name}@odata.type"] = _utc_text(value), "Edm.DateTime"
            continue
        if type(value) is float and math.isfinite(value):  # amounts
            found[name], found[f"{name}@odata.type"] = value, "Edm.Double"
            continue
        if type(value) is int and value in INT32:  # counts: untyped, the service's Edm.Int32
            found[name] = value
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
            if value not in INT32:
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
    if value.tzinfo is UTC:  # the store's own times: "+00:00" becomes "Z" (arguments by position: faster)
        return value.isoformat("T", "microseconds")[:-6] + "Z"
    return value.astimezone(UTC).replace(tzinfo=None).isoformat("T", "microseconds") + "Z"


def _double(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def decode(body: bytes, operations: int) -> list[str] | TransactionFailure:
    """The changeset response: one 2xx answer per operation, whose ETags this returns ("" for
    an answer without one, a delete's), or the one that failed (the service stops at the
    first failure and answers for it alone). Anything else — fewer answers, none, not a
    changeset — may or may not have been applied: ServiceResponseError, which the store
    treats as transient (the redelivery then finds what was written).

    Answers come in the operations' order (the SDK maps them by position; Azurite numbers
    none of them). Where every answer carries a Content-ID, the order is theirs: the
    requests' ids are their positions, so an answer echoing its request's id finds it,
    and ids numbered from 1 in the answers' order change nothing."""
    spans: list[tuple[int, int]] = []  # each answer's headers and body: from its status line to the next's
    for match in _STATUS.finditer(body):
        status, end = int(match.group(1)), match.end()
        if not 200 <= status < 300:
            return TransactionFailure.of(status, *_error(body[end:]))
        if spans:
            spans[-1] = (spans[-1][0], match.start())
        spans.append((end, len(body)))
    if len(spans) != operations:
        raise ServiceResponseError(f"a transaction of {operations} operations was answered {len(spans)} times")
    # Header names are case-insensitive: found in the body lowercased once. A success's body is
    # JSON, whose strings hold no line break: a header line is the only "\n<name>:" of its answer.
    lowered = body.lower()
    etags: list[str] = []
    ids: list[int] = []
    for start, stop in spans:
        etag = lowered.find(b"\netag:", start, stop) + 6  # 5 where there is none
        line_end = body.find(b"\n", etag, stop)
        etags.append(body[etag : line_end if line_end >= 0 else stop].strip().decode("latin-1") if etag > 5 else "")
        content_id = _CONTENT_ID.search(lowered, start, stop)
        if content_id:
            ids.append(int(content_id.group(1)))
    if len(ids) == len(etags) and len(set(ids)) == len(ids) and ids != sorted(ids):
        etags = [etag for _, etag in sorted(zip(ids, etags, strict=True))]
    return etags


def check_changeset(pipeline_response: Any) -> None:
    """A ``raw_response_hook`` for the SDK's table clients: a 202 to ``$batch`` that is not a
    changeset answering every operation (not multipart, fewer answers, none) raises
    ServiceResponseError, as ``submit`` does. The SDK would raise a ValueError for the first
    and return fewer answers than operations for the others; either may have been applied."""
    request, response = pipeline_response.http_request, pipeline_response.http_response
    if response.status_code != 202 or not request.url.endswith("/$batch"):
        return
    if not (response.headers.get("Content-Type") or "").startswith("multipart/mixed"):
        raise ServiceResponseError(f"a transaction was answered with {response.headers.get('Content-Type')!r}")
    decode(response.read(), bytes(request.content or b"").count(_OPERATION))  # its refusals are the SDK's to read


def _error(part: bytes) -> tuple[str, str]:
    """(code, message) of a changeset part's answer: its headers (x-ms-error-code first,
    as the service sends it), then its error body, up to the next boundary."""
    head_end = _HEAD_END.search(part)
    head, rest = (part[: head_end.start()], part[head_end.end() :]) if head_end else (part, b"")
    code, message = _error_body(_BOUNDARY.split(rest or part, 1)[0].strip())
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


def _refused(
    response: Any, status: int, code: str, message: str, kind: type[HttpResponseError] | None = None
) -> HttpResponseError:
    """The error for a refusal, as the SDK's: ``kind``, else its class by code (any 401/403 an
    authentication error); its message (the service's, then the code: an operation's index
    leads), ``status_code`` and the service's ``error_code`` (None when it gave none)."""
    kind = kind or _BY_CODE.get(code, ClientAuthenticationError if status in (401, 403) else HttpResponseError)
    text = message or f"Operation returned an invalid status {status}"  # azure-core's words, a part's status
    error = kind(message=f"{text}\nErrorCode:{code}" if code else text, response=response)
    error.status_code = status  # a part's own, not the 202 around it (the SDK says 202 for a 413 part)
    error.error_code = code or None  # type: ignore[attr-defined]  # the SDK's errors carry it undeclared
    return error
