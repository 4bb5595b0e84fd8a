"""Azure Cosmos DB for NoSQL store.

Layout: one container partitioned by ``/partitionKey``, a property the store owns and sets
to the message's partition (the order id for the orders consumer), so that a message's
marker and documents share one logical partition and commit in one transactional batch,
and no business field (an event's ``orderId``, say) is ever taken for the partition.
Ids reuse the Table encoding (``dedup|<scope>|<id>``; documents by their encoded name).

- One business document: the document *is* the marker (the pattern's example). Its id is
  derived from the dedup key, it carries the fingerprint, and ``create_item`` claims and
  writes at once; a 409 means it exists: one read tells duplicate from mismatch.
- Several documents: a guard (key, fingerprint), the marker and the documents go into
  one batch; the index of the operation that failed with 409 tells "same payload" (the
  guard) from "different payload" (the marker) in one request, as on Table Storage.
- Retention is native: markers and guards carry ``ttl``; business documents ``ttl: -1``
  so that the container's ``defaultTtl`` never removes them.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from azure.core import MatchConditions
from azure.cosmos import ContainerProxy, exceptions

from ..config import DEAD_LETTER_RETENTION
from ..errors import StoreRefused, VersionConflict
from ..keys import DedupKey, encode_key, guard_id, marker_id
from ..messages import Entity, utcnow
from ._azure import store_errors
from ._base import DedupStore, check_storable, refused
from ._codec import (
    MARKER_FIELDS,
    dead_letter_fields,
    dead_letter_from,
    kept,
    marker_fields,
    marker_from,
    state_fingerprint,
)
from ._records import (
    GUARD_KIND,
    LIBRARY_RECORD,
    MARKER_KIND,
    Commit,
    CommitResult,
    CommitStatus,
    DeadLetter,
    Marker,
    State,
    StoredItem,
    StoredState,
)

MAX_BATCH_OPERATIONS = 100  # Cosmos transactional batch limit (and 2 MB)
MAX_ITEM_BYTES = 2 * 1024 * 1024  # an item, as JSON
_OWN_FIELDS_BYTES = 1024  # room for the store's own fields (id, partition key, entity, ttl, _etag, ...)
STATE_VERSION = "stateVersion"  # the version of a document written by upsert_if_newer
STATE_FINGERPRINT = "stateFingerprint"  # and the state_fingerprint of its data
_ITEM_FIELDS = frozenset({"id", "entity", "ttl", "_rid", "_self", "_etag", "_attachments", "_ts"})
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # fixed width: string order is time order in queries


def _time(value: datetime) -> str:
    return value.astimezone(UTC).strftime(_TIME)


def _parse_time(value: str | None) -> datetime | None:
    return datetime.strptime(value, _TIME).replace(tzinfo=UTC) if value else None


class CosmosStore(DedupStore):
    def __init__(
        self,
        container: ContainerProxy,
        dead_letters: ContainerProxy,
        partition_field: str,
        *,
        dead_letter_retention: timedelta = DEAD_LETTER_RETENTION,
    ) -> None:
        """``partition_field``: the property named by the container's partition key path.
        The dead-letter container needs TTL on (``defaultTtl: -1``): each record carries its own."""
        self.dead_letter_retention = dead_letter_retention
        self._container = container
        self._dead = dead_letters
        self._pk = partition_field

    @property
    def container(self) -> ContainerProxy:
        return self._container

    @property
    def dead_letter_container(self) -> ContainerProxy:
        return self._dead

    @property
    def partition_field(self) -> str:
        return self._pk

    # -- atomic path ---------------------------------------------------------------------

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        results = []
        for commit in commits:  # one partition key per batch
            try:
                self.check_effects(commit.effects)
                results.append(self._commit(commit))
            except (StoreRefused, TypeError) as exc:  # the data, checked before sending, or the service's answer
                results.append(refused(exc))
        return results

    def _commit(self, commit: Commit) -> CommitResult:
        key, partition, fingerprint, effects, expires_at = (commit.key, commit.partition, commit.fingerprint,
                                                            commit.effects, commit.expires_at)  # fmt: skip
        marker = commit.marker(utcnow())
        if len(effects) == 1 and not effects[0].name.startswith(LIBRARY_RECORD):  # the library's own: never merged
            return self._commit_document_as_marker(commit, marker, effects[0])
        if len(effects) + 2 > MAX_BATCH_OPERATIONS:
            raise ValueError(f"a Cosmos batch holds at most {MAX_BATCH_OPERATIONS - 2} documents")
        guard = {"id": guard_id(key, fingerprint), self._pk: partition, "kind": GUARD_KIND, "ttl": _ttl(expires_at)}
        operations: list[Any] = [("create", (guard,)), ("create", (self._marker_item(marker),))]
        operations += [("create", (self._document(partition, effect),)) for effect in effects]
        try:
            with store_errors():
                self._container.execute_item_batch(operations, partition_key=partition)
        except exceptions.CosmosBatchOperationError as exc:
            if _status_at(exc, exc.error_index) != 409:
                raise
            return self.conflict(commit, guard_exists=exc.error_index == 0)
        return CommitResult(CommitStatus.NEW, fingerprint)

    def _commit_document_as_marker(self, commit: Commit, marker: Marker, effect: Entity) -> CommitResult:
        """The business document, under its own id, carries the marker's fields and never
        expires: it is both the record and the marker. A 409 on its id: if it carries this
        key, its fingerprint tells duplicate from mismatch; if it does not, the business
        document outlived its marker — applied, the same rule as the Table store's."""
        document, fields = self._document(marker.partition, effect), self._marker_item(marker)
        taken = MARKER_FIELDS & effect.data.keys()  # every field a marker may carry, present or not
        if taken:
            raise ValueError(
                f"entity {effect.name!r}: {sorted(taken)} are the marker's fields in a one-document commit"
            )
        item = {**fields, **document, "ttl": -1}
        try:
            with store_errors():
                self._container.create_item(item)
        except exceptions.CosmosResourceExistsError:
            with store_errors():
                existing = self._container.read_item(document["id"], partition_key=marker.partition)
            if not self._carries(existing, marker.key):
                return CommitResult(CommitStatus.DUPLICATE, None)
            if commit.retry and commit.owner is not None and existing.get("owner") == commit.owner:
                return CommitResult(CommitStatus.NEW, marker.fingerprint)  # our earlier attempt, its answer lost
            stored_fp = existing.get("fingerprint")
            status = CommitStatus.DUPLICATE if stored_fp == marker.fingerprint else CommitStatus.MISMATCH
            return CommitResult(status, stored_fp)
        return CommitResult(CommitStatus.NEW, marker.fingerprint)

    @staticmethod
    def _carries(item: dict[str, Any], key: DedupKey) -> bool:
        return item.get("kind") == MARKER_KIND and (item.get("scope"), item.get("keyId"), item.get("step") or "") == (
            key.scope, key.id, key.step)  # fmt: skip

    # -- two-phase primitives ------------------------------------------------------------

    def get(self, key: DedupKey, partition: str) -> Marker | None:
        """A point read of the marker; for a message committed as one business document
        (its own marker, under the document's id), a query of the partition."""
        item: dict[str, Any]
        try:
            with store_errors():
                item = dict(self._container.read_item(marker_id(key), partition_key=partition))
        except exceptions.CosmosResourceNotFoundError:
            if key.step:
                return None
            query = "SELECT * FROM c WHERE c.kind = @kind AND c.scope = @scope AND c.keyId = @key AND c.entity != null"
            parameters: list[dict[str, Any]] = [{"name": "@kind", "value": MARKER_KIND},
                                                {"name": "@scope", "value": key.scope},
                                                {"name": "@key", "value": key.id}]  # fmt: skip
            with store_errors():
                found = list(self._container.query_items(query, parameters=parameters, partition_key=partition))
            if not found:
                return None
            item = found[0]
        return self._marker_from(item)

    def insert(self, marker: Marker) -> Marker | None:
        try:
            with store_errors():
                item = self._container.create_item(self._marker_item(marker))
        except exceptions.CosmosResourceExistsError:
            return None
        return replace(marker, version=item["_etag"])

    def replace(self, marker: Marker, if_version: str) -> Marker:
        try:
            with store_errors():
                item = self._container.replace_item(
                    marker_id(marker.key),
                    self._marker_item(marker),
                    etag=if_version,
                    match_condition=MatchConditions.IfNotModified,
                )
        except (exceptions.CosmosAccessConditionFailedError, exceptions.CosmosResourceNotFoundError) as exc:
            raise VersionConflict(str(exc)) from exc
        return replace(marker, version=item["_etag"])

    def stale_claims(self, lease_expired_before: datetime, limit: int) -> list[Marker]:
        query = (
            "SELECT * FROM c WHERE c.kind = @kind AND c.state = @state AND c.leaseUntil < @cutoff"
        )  # fmt: skip
        parameters: list[dict[str, Any]] = [
            {"name": "@kind", "value": MARKER_KIND},
            {"name": "@state", "value": State.IN_PROGRESS.value},
            {"name": "@cutoff", "value": _time(lease_expired_before)},
        ]
        with store_errors():
            items = self._container.query_items(query, parameters=parameters, enable_cross_partition_query=True)
            return [self._marker_from(item) for item in islice(items, limit)]

    # -- naturally idempotent writes ----------------------------------------------------

    def read_state(self, partition: str, name: str) -> StoredState | None:
        try:
            with store_errors():
                current = self._container.read_item(encode_key(name), partition_key=partition)
        except exceptions.CosmosResourceNotFoundError:
            return None
        return StoredState(int(current.get(STATE_VERSION, -1)), current["_etag"], current.get(STATE_FINGERPRINT))

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None) -> bool:
        body = {**self._document(partition, entity), STATE_VERSION: version,
                STATE_FINGERPRINT: state_fingerprint(entity.data)}  # fmt: skip
        try:
            with store_errors():
                if if_etag is None:
                    self._container.create_item(body)
                else:
                    self._container.replace_item(body["id"], body, etag=if_etag,
                                                 match_condition=MatchConditions.IfNotModified)  # fmt: skip
        except (exceptions.CosmosResourceExistsError, exceptions.CosmosAccessConditionFailedError):
            return False
        return True

    # -- the library's own records beside the data ------------------------------------------

    def read_entities(self, partition: str, prefix: str, limit: int) -> list[Entity]:
        query = "SELECT * FROM c WHERE STARTSWITH(c.entity, @prefix) ORDER BY c.entity"
        with store_errors():
            items = list(islice(self._container.query_items(query, parameters=[{"name": "@prefix", "value": prefix}],
                                                            partition_key=partition), limit))  # fmt: skip
        return [Entity(item["entity"], {k: v for k, v in item.items() if k not in _ITEM_FIELDS and k != self._pk})
                for item in items]  # fmt: skip

    def put_entity(self, partition: str, entity: Entity) -> None:
        check_storable([entity])
        with store_errors():
            self._container.upsert_item(self._document(partition, entity))

    def delete_entities(self, partition: str, names: Sequence[str]) -> None:
        for name in names:
            try:
                with store_errors():
                    self._container.delete_item(encode_key(name), partition_key=partition)
            except exceptions.CosmosResourceNotFoundError:
                pass  # already gone

    # -- dead letters --------------------------------------------------------------------

    def dead_letter(self, record: DeadLetter) -> None:
        """One item: a body ``kept`` whole (1 MiB) is 1.4 MB of base64, beside fields of
        at most ~50 KB, in an item of at most 2 MB."""
        stored, recorded = kept(record), record.recorded_at or utcnow()
        fields = _to_cosmos(dead_letter_fields(stored, recorded, recorded + self.dead_letter_retention))
        item = {**fields, "id": record.record_id, "body": base64.b64encode(stored.body).decode(),
                "ttl": max(1, int(self.dead_letter_retention.total_seconds()))}  # fmt: skip
        with store_errors():
            self._dead.upsert_item(item)

    def dead_letters(self, scope: str) -> list[DeadLetter]:
        parameters: list[dict[str, Any]] = [{"name": "@scope", "value": scope}]
        with store_errors():
            items = list(
                self._dead.query_items("SELECT * FROM c WHERE c.scope = @scope", parameters=parameters,
                                       partition_key=scope)
            )  # fmt: skip
        return [dead_letter_from(_from_cosmos(item), base64.b64decode(item["body"])) for item in items]

    def scan(self, partition: str | None = None) -> Iterator[StoredItem]:
        scope: dict[str, Any] = (
            {"enable_cross_partition_query": True} if partition is None else {"partition_key": partition}
        )
        with store_errors():
            for item in self._container.query_items("SELECT * FROM c", **scope):
                kind = item.get("kind")
                key = DedupKey(item["scope"], item["keyId"], item.get("step") or "") if kind == MARKER_KIND else None
                yield StoredItem(item["id"], kind, key, item.get("entity"), item)

    # -- item mapping ------------------------------------------------------------------

    def _marker_item(self, marker: Marker) -> dict[str, Any]:
        fields = _to_cosmos(marker_fields(marker))
        return {**fields, "id": marker_id(marker.key), self._pk: marker.partition, "ttl": _ttl(marker.expires_at)}

    def _document(self, partition: str, effect: Entity) -> dict[str, Any]:
        if {"id", "ttl", "entity"} & effect.data.keys() or effect.data.get(self._pk, partition) != partition:
            raise ValueError(f"entity {effect.name!r}: id, ttl, entity and {self._pk} are the store's to set")
        return {**effect.data, "id": encode_key(effect.name), self._pk: partition, "entity": effect.name, "ttl": -1}

    def check_effects(self, effects: Sequence[Entity]) -> None:
        """Cosmos DB's limit: an item of at most 2 MB of JSON, the store's own fields included."""
        check_storable(effects)
        for effect in effects:
            size = _item_bytes(effect.data) + _OWN_FIELDS_BYTES
            if size > MAX_ITEM_BYTES:
                raise StoreRefused(f"{effect.name}: about {size} bytes of JSON; an item holds {MAX_ITEM_BYTES}")

    def _marker_from(self, item: dict[str, Any]) -> Marker:
        return marker_from(_from_cosmos(item), item[self._pk], item.get("_etag"))


def _item_bytes(data: dict[str, Any]) -> int:
    return len(json.dumps(data, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


def _to_cosmos(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: _time(value) if isinstance(value, datetime) else value for name, value in fields.items()}


def _from_cosmos(item: dict[str, Any]) -> dict[str, Any]:
    times = ("createdAt", "expiresAt", "leaseUntil", "recordedAt")
    return {name: _parse_time(value) if name in times else value for name, value in item.items()}


def _ttl(expires_at: datetime) -> int:
    """Cosmos ``ttl`` is in whole seconds from the last write, at least 1."""
    return max(1, math.ceil((expires_at - utcnow()).total_seconds()))


def _status_at(exc: exceptions.CosmosBatchOperationError, index: int) -> int | None:
    responses = exc.operation_responses or []
    return responses[index].get("statusCode") if 0 <= index < len(responses) else None
