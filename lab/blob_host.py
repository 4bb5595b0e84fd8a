"""The Functions host's blob trigger with ``source="EventGrid"`` (the Storage Blobs extension),
over the real Azurite blob and queue services. A test tool.

What it does, as the host does it (Microsoft.Azure.WebJobs.Extensions.Storage.Blobs):
- its webhook (``/runtime/webhooks/blobs``) takes Event Grid's notifications — an array of
  events in the Event Grid schema, or one event — and puts one message per event on the host's
  blob-trigger queue (``azure-webjobs-blobtrigger-<host id>``), naming the container, the blob
  and its ETag; it answers 202 whatever the function does later, so Event Grid never retries
  for a failed function;
- that queue's listener (lab/queue_host.py) runs the function once per message: it reads the
  blob as it is then (range reads; a blob gone is done), hands it to the function as
  ``azure.functions.InputStream`` with its properties and metadata, and retries a failure at
  once (visibility timeout 0), at most ``poisonBlobThreshold`` runs, then puts the message on
  ``webjobs-blobtrigger-poison``;
- no blob receipts: every event runs the function, a duplicate and an overwrite alike.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import azure.functions as func
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.functions.blob import InputStream
from azure.storage.blob import BlobServiceClient, ContentSettings
from azure.storage.queue import QueueMessage as StoredMessage

from lab.queue_host import QueueHost, Tally

BLOB_CREATED = "Microsoft.Storage.BlobCreated"
POISON = "webjobs-blobtrigger-poison"
RANGE = 4 * 1024 * 1024  # the reads' range size: a larger blob is read in several requests
ACCOUNT_ID = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/lab/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"  # noqa: E501


class BlobHost:
    """One instance's blob trigger for ``function`` on ``container`` (created if need be).
    ``faults(stage, message)`` as QueueHost's."""

    def __init__(self, blob_connection: str, queue_connection: str, container: str,
                 function: Callable[[func.InputStream], None], *, host_id: str = "lab", poison_threshold: int = 5,
                 lease: timedelta = timedelta(minutes=10), tally: Tally | None = None,
                 faults: Callable[[str, StoredMessage], None] | None = None) -> None:  # fmt: skip
        self.blobs = BlobServiceClient.from_connection_string(blob_connection, max_single_get_size=RANGE,
                                                              max_chunk_get_size=RANGE)  # fmt: skip
        self.function = function
        self.listener = QueueHost(queue_connection, f"azure-webjobs-blobtrigger-{host_id}", self._run,
                                  max_dequeue_count=poison_threshold, lease=lease, poison=POISON,
                                  faults=faults, tally=tally)  # fmt: skip
        self.listener.create_queues()
        self.container = container
        with contextlib.suppress(ResourceExistsError):
            self.blobs.create_container(container)
        self.reads = 0  # blob downloads (each one or more range requests)
        self._modified: dict[str, int] = {}  # per blob, its last upload's Last-Modified (seconds)

    def upload(self, name: str, content: bytes, **metadata: str) -> dict[str, Any]:
        """Upload (overwrite) a blob; the BlobCreated event the storage account publishes for it.
        Last-Modified, the import's version, has whole seconds: an upload waits for the second
        after its blob's last one, as uploads a person or a pipeline makes are apart."""
        while int(time.time()) <= self._modified.get(name, -1):
            time.sleep(0.05)  # until the clock passes the blob's last Last-Modified
        blob = self.blobs.get_blob_client(self.container, name)
        answer = blob.upload_blob(content, overwrite=True, metadata=metadata or None,
                                  content_settings=ContentSettings(content_type="application/x-ndjson"))  # fmt: skip
        self._modified[name] = int(answer["last_modified"].timestamp())
        return blob_created(blob.url, str(answer["etag"]), len(content))

    def notify(self, events: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> int:
        """The webhook: one blob-trigger message per event; the status it answers (202)."""
        for event in [events] if isinstance(events, Mapping) else events:
            container, name = _container_and_name(str(event["data"]["url"]))
            message = {"Type": "BlobTrigger", "FunctionId": "Host.Functions.lab", "BlobType": "BlockBlob",
                       "ContainerName": container, "BlobName": name, "ETag": f'"{event["data"]["eTag"]}"'}  # fmt: skip
            self.listener.queue.send_message(json.dumps(message).encode())
        return 202

    def drain(self, timeout: float = 120.0) -> None:
        """Run the queue's messages until none is left, visible or leased (a crashed run's
        message comes back when its lease lapses); fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.listener.poll():
                if not self.listener.queue.get_queue_properties().approximate_message_count:
                    return
                time.sleep(0.1)  # a leased message: polled again until its lease lapses
        raise AssertionError(f"the blob-trigger queue still had messages after {timeout} s")

    def poisoned(self) -> list[dict[str, Any]]:
        """The blob-trigger messages of its container on the poison queue (shared by every container)."""
        found = [json.loads(bytes(m.content)) for m in self.listener.poison.peek_messages(max_messages=32)]
        return [message for message in found if message["ContainerName"] == self.container]

    def _run(self, message: func.QueueMessage) -> None:
        trigger = json.loads(message.get_body())
        blob = self.blobs.get_blob_client(trigger["ContainerName"], trigger["BlobName"])
        try:
            download = blob.download_blob()
            content = download.readall()
        except ResourceNotFoundError:  # deleted since: the host counts it done
            return
        self.reads += 1
        properties = download.properties
        self.function(InputStream(
            data=content, name=f"{trigger['ContainerName']}/{trigger['BlobName']}", uri=blob.url,
            length=properties.size, metadata=dict(properties.metadata or {}),
            blob_properties={"ContentLength": properties.size, "ContentType": properties.content_settings.content_type,
                             "ETag": properties.etag, "LastModified": properties.last_modified.isoformat(),
                             "BlobType": "Block"}))  # fmt: skip


def blob_created(url: str, etag: str, length: int) -> dict[str, Any]:
    """A BlobCreated event in the Event Grid schema, as a storage account's system topic sends it."""
    container, name = _container_and_name(url)
    return {
        "id": str(uuid.uuid4()),
        "topic": ACCOUNT_ID,
        "subject": f"/blobServices/default/containers/{container}/blobs/{name}",
        "eventType": BLOB_CREATED,
        "eventTime": datetime.now(UTC).isoformat(),
        "data": {
            "api": "PutBlob",
            "clientRequestId": str(uuid.uuid4()),
            "requestId": str(uuid.uuid4()),
            "eTag": etag.strip('"'),
            "contentType": "application/x-ndjson",
            "contentLength": length,
            "blobType": "BlockBlob",
            "url": url,
            "sequencer": f"{uuid.uuid4().int:032x}",
            "storageDiagnostics": {"batchId": str(uuid.uuid4())},
        },
        "dataVersion": "",
        "metadataVersion": "1",
    }


def _container_and_name(url: str) -> tuple[str, str]:
    """The container and blob of a blob URL: ``https://<account>.blob.core.windows.net/<c>/<blob>``,
    or Azurite's ``http://127.0.0.1:<port>/<account>/<c>/<blob>``."""
    parts = urlsplit(url)
    path = parts.path.lstrip("/").split("/")
    if parts.hostname in ("127.0.0.1", "localhost"):
        path = path[1:]
    return path[0], unquote("/".join(path[1:]))
