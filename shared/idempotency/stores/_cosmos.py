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
- Changes of what a handler read (``read_current``: one query of the partition by ids) go
  into the same batch, each replaced or deleted only at the ``_etag`` read (``ifMatch``), or
  created; a 412 (or 409, 404) on one of them refuses the batch: ``CONTENDED``. The commits of
  one call are sent one batch each, a change conditioned on the ``_etag`` the previous batch
  of the call wrote.
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
from ..errors import ConfigurationError, StoreRefused, VersionConflict
from ..keys import DedupKey, encode_key, guard_id, marker_id
from ..messages import Change, Entity, Stored, utcnow
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
    Current,
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
STATE_OWNER = "stateOwner"  # and the token of the delivery that wrote it
_ITEM_FIELDS = frozenset({"id", "entity", "ttl", "_rid", "_self", "_etag", "_attachments", "_ts"})
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # fixed width: string order is time order in queries
_BY_IDS = "SELECT * FROM c WHERE ARRAY_CONTAINS(@ids, c.id)"
_BROKEN = "(broken)"  # an entity whose earlier change in this call failed: what follows it is decided again


def _time(value: datetime) -> str:
    return value.astimezone(UTC).strftime(_TIME)


def _parse_time(value: str | None) -> datetime | None:
    return datetime.strptime(value, _TIME).replace(tzinfo=UTC) if value else None


class CosmosStore(DedupStore):
    commits_changes = True

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
        # (partition, id, _etag) -> the marker fields of a document that is its own message's marker, as
        # read_current found it: a change of it keeps them, so that its message stays a duplicate
        self._carried: dict[tuple[str, str, str], dict[str, Any]] = {}

    def check_tables(self) -> None:
        for container in (self._container, self._dead):
            try:
                with store_errors():
                    container.read()
            except exceptions.CosmosResourceNotFoundError:
                raise ConfigurationError(f"container {container.id!r} does not exist: check the app settings "
                                         "(COSMOS_DATABASE, COSMOS_CONTAINER), or deploy it") from None  # fmt: skip

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
        chained: dict[tuple[str, str], str | None] = {}  # (partition, entity): the _etag this call wrote
        for commit in commits:  # one partition key per batch
            try:
                self.check_effects([*commit.effects, *(Entity(c.name, c.data) for c in commit.changes if c.data)])
                result = self._commit(commit, chained)
            except (StoreRefused, TypeError) as exc:  # the data, checked before sending, or the service's answer
                result = refused(exc)
            if result.status is not CommitStatus.NEW:  # its changes were not written: what follows them neither
                chained.update({(commit.partition, c.name): _BROKEN for c in commit.changes})
            results.append(result)
        return results

    def _commit(self, commit: Commit, chained: dict[tuple[str, str], str | None]) -> CommitResult:
        key, partition, fingerprint, effects, expires_at = (commit.key, commit.partition, commit.fingerprint,
                                                            commit.effects, commit.expires_at)  # fmt: skip
        marker = commit.marker(utcnow())
        if len(effects) == 1 and not commit.changes and not effects[0].name.startswith(LIBRARY_RECORD):
            return self._commit_document_as_marker(commit, marker, effects[0])  # the library's own: never merged
        if len(effects) + len(commit.changes) + 2 > MAX_BATCH_OPERATIONS:
            raise ValueError(f"a Cosmos batch holds at most {MAX_BATCH_OPERATIONS - 2} documents and changes")
        versions = [chained.get((partition, change.name), change.etag) for change in commit.changes]
        if _BROKEN in versions:
            return CommitResult(CommitStatus.CONTENDED)
        guard = {"id": guard_id(key, fingerprint), self._pk: partition, "kind": GUARD_KIND, "ttl": _ttl(expires_at)}
        operations: list[Any] = [("create", (guard,)), ("create", (self._marker_item(marker),))]
        operations += [("create", (self._document(partition, effect),)) for effect in effects]
        first_change = len(operations)
        operations += [self._change(partition, c, v) for c, v in zip(commit.changes, versions, strict=True)]
        try:
            with store_errors():
                answers = self._container.execute_item_batch(operations, partition_key=partition)
        except exceptions.CosmosBatchOperationError as exc:
            status = _status_at(exc, exc.error_index)
            if exc.error_index >= first_change and status in (409, 404, 412):  # moved since it was read
                return CommitResult(CommitStatus.CONTENDED)
            if status != 409:
                raise
            return self.conflict(commit, guard_exists=exc.error_index == 0)
        for change, answer in zip(commit.changes, answers[first_change:], strict=True):
            chained[(partition, change.name)] = None if change.data is None else _etag_of(answer)
        return CommitResult(CommitStatus.NEW, fingerprint)

    def _change(self, partition: str, change: Change, etag: str | None) -> tuple[Any, ...]:
        """The batch operation of one change: created (no version), or replaced or deleted at ``etag``."""
        carried = None if etag is None else self._carried.pop((partition, encode_key(change.name), etag), None)
        if change.data is None:
            if carried is not None:
                raise StoreRefused(f"{change.name}: the document is an earlier message's marker on Cosmos DB "
                                   "(committed alone): it can be changed, not deleted")  # fmt: skip
            return ("delete", (encode_key(change.name),), {"if_match_etag": etag})
        document = self._document(partition, Entity(change.name, change.data))
        if etag is None:
            return ("create", (document,))
        return ("replace", (document["id"], {**document, **(carried or {})}), {"if_match_etag": etag})

    def read_current(self, partition: str, keys: Sequence[DedupKey], names: Sequence[str]) -> Current:
        """One query of the partition per ``rows_per_read`` ids, the ids as a parameter."""
        markers, documents = {marker_id(key): key for key in keys}, {encode_key(name): name for name in names}
        wanted, found = [*markers, *documents], {}
        for start in range(0, len(wanted), self.rows_per_read):
            ids: list[dict[str, object]] = [{"name": "@ids", "value": wanted[start : start + self.rows_per_read]}]
            with store_errors():
                items = self._container.query_items(_BY_IDS, parameters=ids, partition_key=partition)
                found.update({item["id"]: item for item in items})
        # documents that are markers (a message committed alone, its one document carrying its marker)
        carriers = {(item["scope"], item["keyId"], item.get("step") or ""): item for item in found.values()
                    if item.get("kind") == MARKER_KIND and item.get("entity")}  # fmt: skip
        if len(self._carried) > 10_000:  # read and never changed: kept for a while, not for ever
            self._carried.clear()
        for carrier in carriers.values():
            self._carried[(partition, carrier["id"], carrier["_etag"])] = {k: carrier[k] for k in
                                                                          MARKER_FIELDS & carrier.keys()}  # fmt: skip
        return Current(
            {key: self._marker_from(marker) for key in keys
             if (marker := found.get(marker_id(key)) or carriers.get((key.scope, key.id, key.step)))},
            {name: Stored(name, self._data(found[i]), found[i]["_etag"]) if i in found else Stored(name, None)
             for i, name in documents.items()},
        )  # fmt: skip

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
                # our earlier attempt, its answer lost: as it was committed
                return CommitResult(CommitStatus.NEW, marker.fingerprint, stored=self._marker_from(existing))
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

    def sequenced(self, scope: str, since: datetime, until: datetime) -> list[Marker]:
        query = (
            "SELECT * FROM c WHERE c.kind = @kind AND c.enqueuedAt >= @since AND c.enqueuedAt < @until"
            " AND (c.scope = @scope OR (c.scope > @own AND c.scope < @past))"
        )  # scope|…: "}" follows "|"
        parameters: list[dict[str, Any]] = [
            {"name": "@kind", "value": MARKER_KIND},
            {"name": "@since", "value": _time(since)},
            {"name": "@until", "value": _time(until)},
            {"name": "@scope", "value": scope},
            {"name": "@own", "value": scope + "|"},
            {"name": "@past", "value": scope + "}"},
        ]
        with store_errors():
            items = self._container.query_items(query, parameters=parameters, enable_cross_partition_query=True)
            return [self._marker_from(item) for item in items]

    # -- naturally idempotent writes ----------------------------------------------------

    def read_state(self, partition: str, name: str) -> StoredState | None:
        try:
            with store_errors():
                current = self._container.read_item(encode_key(name), partition_key=partition)
        except exceptions.CosmosResourceNotFoundError:
            return None
        return StoredState(int(current.get(STATE_VERSION, -1)), current["_etag"], current.get(STATE_FINGERPRINT),
                           current.get(STATE_OWNER))  # fmt: skip

    def write_state(self, partition: str, entity: Entity, version: int, if_etag: str | None, *,
                    owner: str | None = None) -> bool:  # fmt: skip
        body = {**self._document(partition, entity), STATE_VERSION: version,
                STATE_FINGERPRINT: state_fingerprint(entity.data),
                **({STATE_OWNER: owner} if owner else {})}  # fmt: skip
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
        return [Entity(item["entity"], self._data(item)) for item in items]

    def _data(self, item: dict[str, Any]) -> dict[str, Any]:
        """A business document's data: its fields less the store's own (and a marker's, when it is one)."""
        own = _ITEM_FIELDS | MARKER_FIELDS if item.get("kind") == MARKER_KIND else _ITEM_FIELDS
        return {k: v for k, v in item.items() if k not in own and k != self._pk}

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
    times = ("createdAt", "expiresAt", "leaseUntil", "recordedAt", "enqueuedAt")
    return {name: _parse_time(value) if name in times else value for name, value in item.items()}


def _ttl(expires_at: datetime) -> int:
    """Cosmos ``ttl`` is in whole seconds from the last write, at least 1."""
    return max(1, math.ceil((expires_at - utcnow()).total_seconds()))


def _etag_of(answer: dict[str, Any]) -> str | None:
    """The _etag a batch operation wrote (its answer's eTag, or its resource body's)."""
    return answer.get("eTag") or (answer.get("resourceBody") or {}).get("_etag")


def _status_at(exc: exceptions.CosmosBatchOperationError, index: int) -> int | None:
    responses = exc.operation_responses or []
    return responses[index].get("statusCode") if 0 <= index < len(responses) else None
