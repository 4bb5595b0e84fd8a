"""Price lists imported from blobs (recipe ``blob-import``): a JSON Lines file dropped in the
imports container, one price per line keyed by its ``sku``, each applied once in effect —
whether the BlobCreated event comes twice, the same file is uploaded again, a corrected file
replaces it (only the lines it changed apply) or the import dies mid-file (the next run
resumes). How: shared.idempotency.imports. The blob trigger takes its events from Event Grid
(``source="EventGrid"``, what Flex Consumption supports): infra subscribes the storage
account's system topic to it."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity
from shared.idempotency.functions import consumer, on_blob_import, shared_store
from shared.idempotency.imports import FileImport

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["sku", "price", "currency"],
    "properties": {
        "sku": {"type": "string", "minLength": 1, "maxLength": 200},
        "price": {"type": "number", "minimum": 0},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
    },
    "additionalProperties": False,
}


def apply_price(record: dict[str, Any], context: Context) -> Effects:
    return Effects([Entity("price", record)])


@consumer
def prices_import() -> FileImport:
    return FileImport("prices", shared_store(), apply_price, key_field="sku", schema=SCHEMA)


@bp.function_name("price_import")
@bp.blob_trigger(arg_name="blob", path="%IMPORTS_CONTAINER%/{name}", connection="ImportsConnection",
                 source=func.BlobSource.EVENT_GRID)  # fmt: skip
def price_import(blob: func.InputStream) -> None:
    on_blob_import(prices_import, blob)
