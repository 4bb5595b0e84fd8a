"""A query's text and its rows as the lean transport reads them (``TableTransactions.query``):
the filter's ``@name`` parameters substituted as the SDK's ``query_entities`` substitutes them
(text only here: quoted, its quotes doubled, so a value never becomes the filter's syntax), and
each row of the OData JSON answer typed as the SDK's TableEntity holds it
(tests/integration/test_table_query.py reads the same rows both ways)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from azure.data.tables import EdmType, EntityProperty

INT32 = range(-(2**31), 2**31)  # a plain int property; beyond it, typed Edm.Int64


def substituted(query_filter: str, parameters: Mapping[str, str]) -> str:
    """``query_filter`` with each word ``@name`` replaced by its parameter as an OData string literal."""
    words = query_filter.split(" ")
    for n, word in enumerate(words):
        if word.startswith("@"):
            value = parameters[word[1:]]
            if not isinstance(value, str):
                raise TypeError(f"a lean query's parameters are text: {word} is {type(value).__name__}")
            words[n] = "'" + value.replace("'", "''") + "'"
    return " ".join(words)


class Row(dict[str, Any]):
    """A row read: its properties, and ``metadata`` (``etag``, ``timestamp``), as the SDK's TableEntity."""

    metadata: dict[str, Any]


class ServiceTime(datetime):
    """A time read, with the service's own text (``entity_json`` writes that text back), as the SDK's."""

    tables_service_value: str


def row_of(entry: Mapping[str, Any]) -> Row:
    row, types, odata = Row(), {}, {}
    for name, value in entry.items():
        if name.startswith("odata."):
            odata[name[6:]] = value
        elif name.endswith("@odata.type"):
            types[name[:-11]] = value
        elif name != "Timestamp":
            row[name] = value
    for name, kind in types.items():
        if name in row:
            row[name] = _typed(row[name], kind)
    for name, value in row.items():  # an untyped integer past Int32: the SDK's Int64
        if type(value) is int and value not in INT32:
            row[name] = EntityProperty(value, EdmType.INT64)
    timestamp, etag = entry.get("Timestamp"), odata.pop("etag", None)
    if timestamp and not etag:
        etag = "W/\"datetime'" + quote(timestamp) + "'\""
    odata.pop("metadata", None)
    row.metadata = {**odata, "etag": etag, "timestamp": _time(timestamp) if timestamp else None}
    return row


def _typed(value: Any, kind: str) -> Any:
    if kind == EdmType.DATETIME:
        return _time(value)
    if kind == EdmType.INT64:
        return EntityProperty(int(value), EdmType.INT64)
    if kind == EdmType.BINARY:
        return base64.b64decode(value)
    if kind == EdmType.GUID:
        return uuid.UUID(value)
    if kind == EdmType.DOUBLE:
        return float(value)  # "NaN", "Infinity", "-Infinity" too
    if kind == EdmType.INT32:
        return int(value)
    return value  # Edm.String, Edm.Boolean


def _time(text: str) -> ServiceTime:
    """``…T…Z``, its fraction of up to 7 digits cut to microseconds (as the SDK does)."""
    stem, _, fraction = text.rstrip("Z").partition(".")
    moment = ServiceTime.fromisoformat(stem + (f".{fraction[:6]:0<6}" if fraction else "")).replace(tzinfo=UTC)
    moment.tables_service_value = text
    return moment
