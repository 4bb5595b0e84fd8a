"""What tests and checkers read back from a store: business entities and markers, from
``DedupStore.scan`` (never used on the message path)."""

from __future__ import annotations

from typing import Any

from ..keys import DedupKey
from ..stores._base import DedupStore


def entities(store: DedupStore, name: str | None = None, partition: str | None = None) -> list[dict[str, Any]]:
    """The stored business entities (named ``name``, of ``partition``), markers and guards left out."""
    return [item.data for item in store.scan(partition) if item.entity is not None and name in (None, item.entity)]


def marker_keys(store: DedupStore, partition: str | None = None) -> list[DedupKey]:
    """The keys of the stored markers, sorted."""
    return sorted(item.key for item in store.scan(partition) if item.key is not None)
