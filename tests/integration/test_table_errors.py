"""The lean transaction path raises what the Azure SDK raises when the service refuses a
transaction as a whole — above all for authentication and authorization (a wrong key, an
expired token, a managed identity without the "Storage Table Data Contributor" role) — and
when it refuses one operation of a changeset: the same status_code and error_code, the
SDK's exception class or a subclass of it (an authentication error for a 401/403). Both
clients talk to one local server answering each request with a canned response, in the
shapes the Azure Table service sends (JSON, either XML shape, only the x-ms-error-code
header, nothing at all)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
from azure.data.tables import RequestTooLargeError, TableServiceClient, TableTransactionError
from hypothesis import example, given
from hypothesis import strategies as st

from shared.idempotency.stores._table_batch import TableTransactions, TransactionFailure, decode
from tests.integration.canned import Canned, canned_server

# Azurite's well-known account: the canned server checks no signature, but both clients sign.
ACCOUNT = "devstoreaccount1", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
ROWS = [{"PartitionKey": "p", "RowKey": "r0"}, {"PartitionKey": "p", "RowKey": "r1"}]
JSON = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"
DENIED = "This request is not authorized to perform this operation using this permission."
UNAUTHENTICATED = ("Server failed to authenticate the request. Make sure the value of Authorization header is "
                   "formed correctly including the signature.")  # fmt: skip
MAC = "The MAC signature found in the HTTP request 'x' is not the same as any computed signature."
NO_AUTH = "Server failed to authenticate the request. Please refer to the information in the www-authenticate header."
EXISTS = "The specified entity already exists."
TRACE = "\nRequestId:5d3c4a5e-0002-0063-1b4a-3c5f8e000000\nTime:2026-11-30T12:30:15.1234567Z"


def azure_headers(code: str | None, content_type: str | None) -> dict[str, str]:
    """The headers of a real refusal (the error code header only when ``code``)."""
    headers = {"x-ms-request-id": "5d3c4a5e-0002-0063-1b4a-3c5f8e000000", "x-ms-version": "2019-02-02",
               "Server": "Windows-Azure-Table/1.0 Microsoft-HTTPAPI/2.0"}  # fmt: skip
    if code:
        headers["x-ms-error-code"] = code
    if content_type:
        headers["Content-Type"] = content_type
    return headers


def json_error(code: str, message: str) -> bytes:
    return json.dumps({"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}}).encode()


def odata_xml(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="utf-8"?><error xmlns="http://schemas.microsoft.com/ado/2007/08/'
            f'dataservices/metadata"><code>{code}</code><message xml:lang="en-US">{message}</message></error>'
            ).encode()  # fmt: skip


def storage_xml(code: str, message: str, detail: str = "") -> bytes:
    why = f"<AuthenticationErrorDetail>{detail}</AuthenticationErrorDetail>" if detail else ""
    declaration = '<?xml version="1.0" encoding="utf-8"?>'
    return f"{declaration}<Error><Code>{code}</Code><Message>{message}</Message>{why}</Error>".encode()


@pytest.fixture(scope="module")
def server() -> Iterator[Canned]:
    with canned_server() as canned:
        yield canned


def both_raise(server: Canned, status: int, headers: dict[str, str], body: bytes) -> tuple[Any, Any]:
    """(the SDK's error, the lean path's) for one transaction answered so."""
    server.answer = (status, headers, body)
    endpoint, key = f"http://127.0.0.1:{server.server_port}/devstoreaccount1", AzureNamedKeyCredential(*ACCOUNT)
    service = TableServiceClient(endpoint, credential=key, retry_total=0)
    with pytest.raises(HttpResponseError) as sdk:
        service.get_table_client("orders").submit_transaction([("create", row) for row in ROWS])
    lean = TableTransactions.of(service, "orders", retry_total=0)
    try:
        with pytest.raises(HttpResponseError) as mine:
            lean.submit(ROWS)
    finally:
        lean.close()
        service.close()
    return sdk.value, mine.value


AUTH = ClientAuthenticationError
# (status, headers, body, the service's code, the SDK's class, text both messages carry).
# Where the classes differ the SDK is plainly worse: it picks ClientAuthenticationError by code, for
# AuthenticationFailed and InvalidAuthenticationInfo only, so a missing role's 403 or a 401 without credentials
# is a plain HttpResponseError. The lean path raises AUTH for every 401/403: a subclass, caught where the SDK's is.
REFUSALS = {
    "403 JSON, missing role": (403, azure_headers("AuthorizationPermissionMismatch", JSON),
                               json_error("AuthorizationPermissionMismatch", DENIED + TRACE),
                               "AuthorizationPermissionMismatch", HttpResponseError, DENIED),
    "403 JSON, code in the body only": (403, azure_headers(None, JSON),
                                        json_error("AuthorizationPermissionMismatch", DENIED),
                                        "AuthorizationPermissionMismatch", HttpResponseError, DENIED),
    "401 JSON, expired token": (401, azure_headers("InvalidAuthenticationInfo", JSON),
                                json_error("InvalidAuthenticationInfo", "Lifetime validation failed." + TRACE),
                                "InvalidAuthenticationInfo", AUTH, "Lifetime validation failed."),
    "403 OData XML": (403, azure_headers("AuthorizationPermissionMismatch", "application/xml"),
                      odata_xml("AuthorizationPermissionMismatch", DENIED + TRACE),
                      "AuthorizationPermissionMismatch", HttpResponseError, DENIED),
    "403 OData XML, code in the body only": (403, azure_headers(None, "application/xml"),
                                             odata_xml("AuthorizationPermissionMismatch", DENIED),
                                             "AuthorizationPermissionMismatch", HttpResponseError, DENIED),
    "403 storage XML, wrong key": (403, azure_headers("AuthenticationFailed", "application/xml"),
                                   storage_xml("AuthenticationFailed", UNAUTHENTICATED + TRACE, MAC),
                                   "AuthenticationFailed", AUTH, MAC),
    "403 storage XML, code in the body only": (403, azure_headers(None, "application/xml"),
                                               storage_xml("AuthenticationFailed", UNAUTHENTICATED, MAC),
                                               "AuthenticationFailed", AUTH, UNAUTHENTICATED),
    "401 storage XML, no credentials": (401, azure_headers("NoAuthenticationInformation", "application/xml"),
                                        storage_xml("NoAuthenticationInformation", NO_AUTH),
                                        "NoAuthenticationInformation", HttpResponseError, NO_AUTH),
    "403 header only": (403, azure_headers("AuthorizationFailure", None), b"", "AuthorizationFailure",
                        HttpResponseError, None),
    "401 header only": (401, azure_headers("InvalidAuthenticationInfo", None), b"", "InvalidAuthenticationInfo",
                        AUTH, None),
    "403 empty": (403, azure_headers(None, None), b"", None, HttpResponseError, None),
    "401 empty": (401, azure_headers(None, None), b"", None, HttpResponseError, None),
    "403 truncated XML, code in the header": (403, azure_headers("AuthorizationFailure", "application/xml"),
                                              b"<Error><Code>Authoriz", "AuthorizationFailure", HttpResponseError,
                                              None),
}  # fmt: skip


@pytest.mark.parametrize(("status", "headers", "body", "code", "sdk_class", "says"), REFUSALS.values(), ids=REFUSALS)
def test_an_authentication_refusal_raises_as_the_sdks_does(
    server: Canned,
    status: int,
    headers: dict[str, str],
    body: bytes,
    code: str | None,
    sdk_class: type[HttpResponseError],
    says: str | None,
) -> None:
    sdk, lean = both_raise(server, status, headers, body)
    assert type(sdk) is sdk_class  # the SDK as it is: pinned, so that a change in it shows here
    assert type(lean) is ClientAuthenticationError and isinstance(lean, sdk_class)  # as precise, or more
    assert lean.status_code == sdk.status_code == status
    assert lean.error_code == sdk.error_code == code  # the SDK's may be a TableErrorCode: a str enum
    assert type(lean.error_code) is (str if code else type(None))
    if says:  # the service's own words (and AuthenticationErrorDetail), in both messages
        assert says in sdk.message and says in lean.message
    if code:
        assert code in lean.message


def test_a_truncated_xml_body_is_reported_as_its_text(server: Canned) -> None:
    """Where the SDK is worse: it prints "Wasn't XML not JSON, failing" and says "None"; the
    lean path keeps the text."""
    sdk, lean = both_raise(server, 403, azure_headers(None, "application/xml"), b"<Error><Code>Authoriz")
    assert lean.error_code is sdk.error_code is None
    assert lean.message == "<Error><Code>Authoriz" and "Authoriz" not in sdk.message


@pytest.mark.parametrize(
    ("status", "headers", "body", "code", "kind"),
    [
        (404, azure_headers("TableNotFound", JSON), json_error("TableNotFound", "The table specified does not exist."),
         "TableNotFound", ResourceNotFoundError),
        (500, azure_headers("InternalError", "application/xml"), storage_xml("InternalError", "Try again."),
         "InternalError", HttpResponseError),
    ],
    ids=["404 missing table", "500 storage XML"],
)  # fmt: skip
def test_other_refusals_carry_the_same_code(
    server: Canned, status: int, headers: dict[str, str], body: bytes, code: str, kind: type[HttpResponseError]
) -> None:
    sdk, lean = both_raise(server, status, headers, body)
    assert type(lean) is type(sdk) is kind
    assert (lean.status_code, lean.error_code) == (sdk.status_code, sdk.error_code) == (status, code)


def changeset_answer(status: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    """A 202 whose changeset answers the first operation ``status`` (the service answers the
    failing one alone), shaped as test_table_batch.azure_response."""
    part = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    content = (b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"
               b"--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
               + f"HTTP/1.1 {status}\r\nContent-ID: 1\r\nX-Content-Type-Options: nosniff\r\n"
                 f"Cache-Control: no-cache\r\nDataServiceVersion: 3.0;\r\n{part}\r\n".encode()
               + body + b"\r\n--changesetresponse_2--\r\n--batchresponse_1--\r\n")  # fmt: skip
    return 202, {"Content-Type": "multipart/mixed; boundary=batchresponse_1", "x-ms-version": "2019-02-02"}, content


PART_REFUSALS = {
    "JSON": ({"Content-Type": JSON}, json_error("AuthorizationPermissionMismatch", f"0:{DENIED}")),
    "OData XML": ({"Content-Type": "application/xml"}, odata_xml("AuthorizationPermissionMismatch", f"0:{DENIED}")),
    "header only": ({"x-ms-error-code": "AuthorizationPermissionMismatch"}, b""),
    "header and XML": ({"Content-Type": "application/xml", "x-ms-error-code": "AuthorizationPermissionMismatch"},
                       storage_xml("AuthorizationPermissionMismatch", f"0:{DENIED}")),
}  # fmt: skip


@pytest.mark.parametrize(("headers", "body"), PART_REFUSALS.values(), ids=PART_REFUSALS)
def test_an_operation_refused_403_raises_an_authentication_error_with_its_code(
    server: Canned, headers: dict[str, str], body: bytes
) -> None:
    """The SDK raises TableTransactionError for any refused operation, whatever its status:
    the lean path too, and for a 401/403 one an error that is also a ClientAuthenticationError;
    status, code and index the same."""
    sdk, lean = both_raise(server, *changeset_answer("403 Forbidden", headers, body))
    assert type(sdk) is TableTransactionError
    assert isinstance(lean, TableTransactionError) and isinstance(lean, ClientAuthenticationError)
    assert lean.status_code == sdk.status_code == 403  # the operation's, not the 202's
    assert lean.error_code == sdk.error_code == "AuthorizationPermissionMismatch"
    assert lean.index == sdk.index == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [("404 Not Found", "TableNotFound", TableTransactionError), ("409 Conflict", "TableBeingDeleted",
     TableTransactionError), ("412 Precondition Failed", "ConditionNotMet", TableTransactionError),
     ("413 Request Entity Too Large", "RequestBodyTooLarge", RequestTooLargeError)],
    ids=["404 missing table", "409 other code", "412 other code", "413"],
)  # fmt: skip
def test_an_operation_refused_otherwise_raises_the_sdks_class(
    server: Canned, status: str, code: str, kind: type[HttpResponseError]
) -> None:
    """Any other refused operation the caller does not decide on: the SDK's own class (a
    TableTransactionError, whose index the message leads with), the operation's status (the
    SDK says 202 for a 413: the store maps its class) and code."""
    sdk, lean = both_raise(server, *changeset_answer(status, {"Content-Type": JSON},
                                                     json_error(code, f"1:{code}{TRACE}")))  # fmt: skip
    assert type(lean) is type(sdk) is kind
    assert lean.status_code == int(status[:3]) and lean.error_code == code
    if kind is TableTransactionError:  # the SDK's 413 says neither (its message is its own)
        assert (sdk.status_code, sdk.error_code) == (int(status[:3]), code)
        assert lean.index == sdk.index == 1  # type: ignore[attr-defined]


def test_a_conflict_given_by_its_header_and_an_xml_body_is_a_conflict() -> None:
    """Not only JSON: a 409 part's code from its header, its index from an XML message."""
    _, _, body = changeset_answer("409 Conflict", {"x-ms-error-code": "EntityAlreadyExists"},
                                  odata_xml("", f"1:{EXISTS}"))  # fmt: skip
    assert decode(body, 2) == TransactionFailure(1, 409, "EntityAlreadyExists", f"1:{EXISTS}")


@given(st.binary(max_size=200))
@example(b'?xml version="1.0" encoding="bogus"?><Error><Code>x</Code></Error>')  # an unknown encoding
@example(b"error><code>AuthorizationFailure</code><message>cut sh")
def test_no_error_body_makes_decoding_fail(garbage: bytes) -> None:
    """Whatever follows the part's headers (XML-looking or not), the refusal is still read."""
    _, _, body = changeset_answer("403 Forbidden", {}, b"<" + garbage.replace(b"\r\n--", b""))
    failure = decode(body, 2)
    assert failure is not None and failure.status == 403
