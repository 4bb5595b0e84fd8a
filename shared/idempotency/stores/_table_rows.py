"""How the Table store's records map to Table entities: business entities (scalars; nested
values as JSON text; Int64 past Int32), markers and dead letters (PascalCase properties), and
Table Storage's limits, counted as the service counts them."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from azure.data.tables import EdmType

from ..errors import StoreRefused
from ..keys import encode_key, marker_id
from ..messages import Entity
from ._base import check_storable
from ._codec import dead_letter_fields, dead_letter_from, kept, marker_fields, marker_from
from ._records import DeadLetter, Marker
from ._table_query import INT32

# Table Storage's limits (learn: understanding-the-table-service-data-model).
MAX_PROPERTY_BYTES = 64 * 1024
MAX_ENTITY_BYTES = 1024 * 1024
MAX_PROPERTIES = 252  # 255 with PartitionKey, RowKey and Timestamp
# A dead letter's body: Edm.Binary properties of 64,000 bytes (a property holds 64 KiB), in
# the record's entity and, past it, in parts written in the same transaction. An entity
# holds 1 MiB, which Azurite counts on its JSON (base64: 4/3 of the bytes), so 12 chunks a
# part (1,024,000 characters) and 10 in the record's entity, beside its fields (at most
# ~135 KB of JSON with every text at its limit).
_BODY_CHUNK = 64_000
_RECORD_CHUNKS = 10
_PART_CHUNKS = 12
# Compact, and UTF-8 rather than ASCII escapes: "é" is one character of a property's 64 KiB, not six.
# (json.dumps builds an encoder per call otherwise.)
_compact_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def effect_entity(pk: str, effect: Entity) -> dict[str, Any]:
    entity: dict[str, Any] = {"PartitionKey": pk, "RowKey": encode_key(effect.name)}
    for name, value in effect.data.items():
        # Tables hold scalars only: nested values are stored as JSON text.
        if isinstance(value, dict | list):
            value = _compact_json(value)
        elif type(value) is int and value not in INT32:
            value = (value, EdmType.INT64)
        entity[name] = value
    return entity


def effect_rows(pk: str, effects: Sequence[Entity]) -> list[dict[str, Any]]:
    """The effects as Table entities in partition ``pk``, refused (StoreRefused, TypeError) past
    Table Storage's limits, counted as the service counts them (strings in UTF-16): a property
    of at most 64 KiB, at most 252 of one's own, an entity of at most 1 MiB."""
    check_storable(effects)
    rows = [effect_entity(pk, effect) for effect in effects]
    for effect, entity in zip(effects, rows, strict=True):
        if len(entity) - 2 > MAX_PROPERTIES:
            raise StoreRefused(f"{effect.name}: {len(entity) - 2} properties; an entity holds {MAX_PROPERTIES}")
        size = 4 + 2 * len(entity["RowKey"])
        for name, value in islice(entity.items(), 2, None):  # after PartitionKey and RowKey
            value = value[0] if isinstance(value, tuple) else value
            if isinstance(value, str):  # ASCII: two bytes a character, without encoding it
                held = 2 * len(value) if value.isascii() else len(value.encode("utf-16-le", "surrogatepass"))
            else:
                held = len(value) if isinstance(value, bytes) else 8
            if held > MAX_PROPERTY_BYTES:
                raise StoreRefused(f"{effect.name}.{name}: {held} bytes; a property holds {MAX_PROPERTY_BYTES}")
            size += 8 + 2 * len(name) + held
        if size > MAX_ENTITY_BYTES:
            raise StoreRefused(f"{effect.name}: about {size} bytes; an entity holds {MAX_ENTITY_BYTES}")
    return rows


def marker_entity(marker: Marker) -> dict[str, Any]:
    return {"PartitionKey": encode_key(marker.partition), "RowKey": marker_id(marker.key),
            **_to_table(marker_fields(marker))}  # fmt: skip


def marker_of(entity: Any, partition: str) -> Marker:
    return marker_from(_from_table(entity), partition, entity.metadata.get("etag"))


def dead_letter_entities(record: DeadLetter, retention: timedelta, now: datetime) -> list[dict[str, Any]]:
    """One entity, or (a body past its 10 chunks) the record's entity and its parts (RowKey
    ``<record id>|<n>``), which expire with it: the purge deletes them by their ExpiresAt."""
    stored, recorded = kept(record), record.recorded_at or now
    expires = recorded + retention
    pk, row = encode_key(record.scope), record.record_id
    chunks = [stored.body[i : i + _BODY_CHUNK] for i in range(0, len(stored.body), _BODY_CHUNK)]
    parts = [chunks[i : i + _PART_CHUNKS] for i in range(_RECORD_CHUNKS, len(chunks), _PART_CHUNKS)]
    entity = {"PartitionKey": pk, "RowKey": row, **_to_table(dead_letter_fields(stored, recorded, expires)),
              **_body(chunks[:_RECORD_CHUNKS])}  # fmt: skip
    if parts:
        entity["BodyParts"] = len(parts)
    return [entity, *({"PartitionKey": pk, "RowKey": f"{row}|{n}", "Part": n, "ExpiresAt": expires, **_body(part)}
                      for n, part in enumerate(parts, start=1))]  # fmt: skip


def dead_letter_records(entities: Sequence[Any]) -> list[DeadLetter]:
    """The records of a scope's entities, each with its parts; one whose parts are gone
    (expired and half purged: its entities go apart) is passed over."""
    parts = {entity["RowKey"]: entity for entity in entities if "Part" in entity}
    records = []
    for entity in entities:
        if "Part" in entity:
            continue
        names = [f"{entity['RowKey']}|{n}" for n in range(1, entity.get("BodyParts", 0) + 1)]
        if not all(name in parts for name in names):
            continue
        whole = [entity, *(parts[name] for name in names)]
        body = b"".join(_as_bytes(e[f"Body{i}"]) for e in whole for i in range(e.get("BodyChunks", 0)))
        records.append(dead_letter_from(_from_table(entity), body))
    return records


def _to_table(fields: dict[str, Any]) -> dict[str, Any]:
    """Table properties are PascalCase scalars: a result is stored as JSON text."""
    table = {_PASCAL[name]: value for name, value in fields.items()}
    if "result" in fields:
        table["Result"] = _compact_json(fields["result"])
    return table


class _Pascal(dict[str, str]):
    """Field names in PascalCase, each computed once (they are few and fixed: _codec.py)."""

    def __missing__(self, name: str) -> str:
        self[name] = pascal = name[0].upper() + name[1:]
        return pascal


_PASCAL = _Pascal()


def _from_table(entity: Any) -> dict[str, Any]:
    fields = {name[0].lower() + name[1:]: value for name, value in entity.items()}
    if "result" in fields:
        fields["result"] = json.loads(fields["result"])
    return fields


def _body(chunks: list[bytes]) -> dict[str, Any]:
    return {"BodyChunks": len(chunks), **{f"Body{i}": chunk for i, chunk in enumerate(chunks)}}


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else base64.b64decode(value)
