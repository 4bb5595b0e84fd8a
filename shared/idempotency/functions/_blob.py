"""Blob imports: ``on_blob_import``. With ``source="EventGrid"`` (what Flex Consumption
supports) the host puts each BlobCreated event on its blob-trigger queue and runs the function
for it, reading the blob as it is then — no blob receipts: a duplicate event, or another upload
of the same content, runs it again. Raising is the retry: at most host.json's
``extensions.blobs.poisonBlobThreshold`` runs (default 5), then the host puts the blob's name
on the ``webjobs-blobtrigger-poison`` queue. The blob stays where it is: the next run (a new
upload, or the poison message put back) resumes where the last one stopped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import azure.functions as func

from ..config import DedupConfig
from ..imports import FileImport
from ..messages import Outcome, Result
from ..reasons import Reason
from ._host import host_setting, timespan
from ._settle import RetryLater

log = logging.getLogger("idempotency")
MARGIN = timedelta(seconds=30)  # a run's last chunk and its answer, within functionTimeout


def on_blob_import(importer: Callable[[], FileImport], blob: func.InputStream) -> None:
    """Import the blob (``<container>/<blob>``) record by record (``shared.idempotency.imports``),
    at its Last-Modified; stop in time for functionTimeout, and raise while records are left or
    still failing, so that the host runs it again."""
    started, built = time.monotonic(), importer()
    run = built.run(str(blob.name), blob.read(), blob_version(blob), deadline=started + budget().total_seconds())
    log.info("dedup import %s: %s (version %d), %d records: %d applied, %d unchanged, %d stale, %d refused, "
             "%d left%s", built.name, run.file, run.version, run.records, run.count(Outcome.PROCESSED), run.unchanged,
             run.stale, run.count(Outcome.INVALID) + run.count(Outcome.CONFLICT), run.pending,
             " (recognised: imported whole before)" if run.recognised else "")  # fmt: skip
    if not run.done:
        failing = [r for r in run.results if not r.acknowledge]
        why = f"first: {failing[0].reason}" if failing else "the run's time is up"
        raise RetryLater(Result(Outcome.TRANSIENT, None, Reason.ITEMS_FAILED,
                                f"{len(failing) + run.pending} record(s) of {run.file} left, {why}"))  # fmt: skip


def blob_version(blob: func.InputStream) -> int:
    """The blob's Last-Modified (whole seconds since 1970), which orders its uploads."""
    modified = (getattr(blob, "blob_properties", None) or {}).get("LastModified")  # the worker's InputStream
    if not modified:
        raise ValueError(f"the blob trigger gave {blob.name} no LastModified: its uploads cannot be ordered")
    return int(datetime.fromisoformat(str(modified)).timestamp())


def budget() -> timedelta:
    """How long a run may start chunks: functionTimeout less a chunk's wait (DEDUP_TRANSIENT_WAIT)
    and a margin; without a timeout, a day."""
    limit = timespan(host_setting("functionTimeout")) or timedelta(days=1)
    return max(limit - DedupConfig.from_settings().transient_wait - MARGIN, timedelta(0))
