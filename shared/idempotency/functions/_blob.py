"""Blob imports: ``on_blob_import``. With ``source="EventGrid"`` (what Flex Consumption
supports) the host puts each BlobCreated event on its blob-trigger queue and runs the function
for it, reading the blob as it is then — no blob receipts: a duplicate event, or another upload
of the same content, runs it again. Raising is the retry: at most host.json's
``extensions.blobs.poisonBlobThreshold`` runs (default 5), then the host puts the blob's name
on the ``webjobs-blobtrigger-poison`` queue. The blob stays where it is: the next run (a new
upload, or the poison message put back) resumes where the last one stopped."""

from __future__ import annotations

import logging
from collections.abc import Callable

import azure.functions as func

from ..imports import FileImport
from ..messages import Outcome, Result
from ..reasons import Reason
from ._settle import RetryLater

log = logging.getLogger("idempotency")


def on_blob_import(importer: Callable[[], FileImport], blob: func.InputStream) -> None:
    """Import the blob (``<container>/<blob>``) record by record (``shared.idempotency.imports``);
    raise while a record still fails, so that the host runs it again."""
    built = importer()
    run = built.run(str(blob.name), blob.read())
    log.info("dedup import %s: %s, %d records: %d applied, %d unchanged, %d refused%s", built.name, run.file,
             run.records, run.count(Outcome.PROCESSED), run.unchanged, run.count(Outcome.INVALID),
             " (the same content, imported before)" if run.recognised else "")  # fmt: skip
    if not run.done:
        failing = [r for r in run.results if not r.acknowledge or r.outcome is Outcome.CONFLICT]
        raise RetryLater(Result(Outcome.TRANSIENT, None, Reason.ITEMS_FAILED,
                                f"{len(failing)} record(s) of {run.file}, first: {failing[0].reason}"))  # fmt: skip
