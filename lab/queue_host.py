"""A Storage queue listener run as the Functions host runs one (the Storage Queues extension's
QueueListener and QueueProcessor), over the real Azurite queue service. A test tool.

What it does, as the host does it:
- Get Messages, up to ``batch_size``, each leased for ``lease`` (the host: 10 minutes, renewed
  at half of it while the function runs; a renewal is Update Message, which hands a new pop
  receipt); the service counts the dequeues;
- a message dequeued more than ``max_dequeue_count`` times is moved to the poison queue without
  running the function (a host died while it ran);
- success: Delete Message with the last pop receipt. Failure: on the ``max_dequeue_count``-th
  dequeue, the poison queue (``<queue>-poison``) gets a new message with the same body and the
  original is deleted; before it, Update Message makes it visible again after
  ``visibility_timeout``;
- a batch's messages run at once (one invocation each); a crash (the process dies while a
  function runs) settles nothing it still holds: their leases lapse and they are dequeued again,
  by this instance or another. A lost delete (its request never reached the service) leaves that
  one message to come back.

The body goes to the function base64-decoded (host.json ``messageEncoding``: base64, the
default), as ``azure.functions.QueueMessage`` with the metadata the host sends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

import azure.functions as func
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.functions.queue import QueueMessage as WorkerMessage
from azure.storage.queue import BinaryBase64DecodePolicy, BinaryBase64EncodePolicy, QueueClient
from azure.storage.queue import QueueMessage as StoredMessage

from shared.idempotency.testing.faults import Crash

Function = Callable[[func.QueueMessage], None]
# What the host logs (a warning) as it moves a message to the poison queue: azure-sdk-for-net
# sdk/storage/Microsoft.Azure.WebJobs.Extensions.Storage.Common Shared/Queues/QueueProcessor.cs.
# infra's storage-poison-queue alert searches the app's logs for it.
POISON_LOG = "Message has reached MaxDequeueCount of {}. Moving message to queue '{}'."
log = logging.getLogger("Host.Triggers.Queue")


def queue_client(connection: str, name: str) -> QueueClient:
    """A client that encodes and decodes bodies as base64, as the host's default encoding."""
    return QueueClient.from_connection_string(connection, name, message_encode_policy=BinaryBase64EncodePolicy(),
                                              message_decode_policy=BinaryBase64DecodePolicy())  # fmt: skip


def delivered(message: StoredMessage) -> func.QueueMessage:
    """The message as the worker hands it to the function (azure.functions.queue's converter)."""
    return WorkerMessage(  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated
        id=message.id, body=bytes(message.content), dequeue_count=message.dequeue_count,
        expiration_time=message.expires_on, insertion_time=message.inserted_on,
        time_next_visible=message.next_visible_on, pop_receipt=message.pop_receipt)  # fmt: skip


@dataclass
class Tally:
    invocations: int = 0
    deleted: int = 0
    released: int = 0  # made visible again after a failure
    poisoned: int = 0
    crashes: int = 0
    lost_deletes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class QueueHost:
    """One instance's listener on ``queue`` for ``function``. ``faults(stage, message)`` may
    raise Crash at "invoke" (the process dies while the function runs; the function may raise it
    too) or "delete" (after it succeeded, the delete is lost)."""

    def __init__(self, connection: str, queue: str, function: Function, *, max_dequeue_count: int = 5,
                 visibility_timeout: timedelta = timedelta(0), lease: timedelta = timedelta(minutes=10),
                 batch_size: int = 16, faults: Callable[[str, StoredMessage], None] | None = None,
                 tally: Tally | None = None, poison: str | None = None) -> None:  # fmt: skip
        self.queue = queue_client(connection, queue)
        self.poison = queue_client(connection, poison or f"{queue}-poison")
        self.function = function
        self.max_dequeue_count = max_dequeue_count
        self.visibility_timeout = visibility_timeout
        self.lease = lease
        self.batch_size = batch_size
        self.faults = faults or (lambda stage, message: None)
        self.tally = tally or Tally()

    def create_queues(self) -> None:
        for client in (self.queue, self.poison):
            with contextlib.suppress(ResourceExistsError):  # created before (409, or 204: the same metadata)
                client.create_queue()

    def poll(self) -> int:
        """One Get Messages and every message it returned processed; how many. The messages run
        at once, as the host dispatches a batch, each under its lease renewed from then on. A
        crash kills the instance: what it still held waits for its lease to lapse."""
        messages = list(self.queue.receive_messages(max_messages=self.batch_size,
                                                    visibility_timeout=int(self.lease.total_seconds())))  # fmt: skip
        if not messages:
            return 0
        leases = [_Renewal(self.queue, message, self.lease) for message in messages]
        died = threading.Event()
        try:
            with ThreadPoolExecutor(len(leases)) as invocations:
                list(invocations.map(lambda lease: self.process(lease, died), leases))
        finally:
            for lease in leases:
                lease.stop()
        if died.is_set():
            self.tally.add(crashes=1)
        return len(messages)

    def process(self, lease: _Renewal, died: threading.Event) -> None:
        """One message of a batch; ``died`` is set once its instance crashed, and from then on
        the instance settles nothing."""
        message = lease.message
        if (message.dequeue_count or 0) > self.max_dequeue_count:
            self._to_poison(lease.stop())
            return
        try:
            self.tally.add(invocations=1)
            self.faults("invoke", message)
            self.function(delivered(message))
        except Crash:
            died.set()
            return
        except Exception:  # noqa: BLE001 - the function failed: the host retries or poisons
            current = lease.stop()
            if died.is_set():
                return
            if (message.dequeue_count or 0) >= self.max_dequeue_count:
                self._to_poison(current)
            else:
                hidden = self._seconds(self.visibility_timeout)
                release = lambda: self.queue.update_message(current.id, pop_receipt=current.pop_receipt,  # noqa: E731
                                                           visibility_timeout=hidden)  # fmt: skip
                if _lease_held(release):
                    self.tally.add(released=1)
            return
        current = lease.stop()
        if died.is_set():
            return  # it ran, and its instance died before the delete
        try:
            self.faults("delete", current)
        except Crash:
            self.tally.add(lost_deletes=1)
            return
        if self._delete(current):
            self.tally.add(deleted=1)

    def _to_poison(self, message: StoredMessage) -> None:
        log.warning(POISON_LOG.format(self.max_dequeue_count, self.poison.queue_name))
        self.poison.send_message(bytes(message.content))
        self._delete(message)
        self.tally.add(poisoned=1)

    def _delete(self, message: StoredMessage) -> bool:
        return _lease_held(lambda: self.queue.delete_message(message.id, pop_receipt=message.pop_receipt))

    @staticmethod
    def _seconds(span: timedelta) -> int:
        return int(span.total_seconds())


def _lease_held(call: Callable[[], object]) -> bool:
    """Run a call that needs the message's lease; False when the lease was lost meanwhile (its
    pop receipt is stale: 400 PopReceiptMismatch, or 404 once another instance deleted it),
    as the host tolerates it."""
    try:
        call()
    except ResourceNotFoundError:
        return False
    except HttpResponseError as exc:
        if exc.status_code == 400 and getattr(exc, "error_code", None) == "PopReceiptMismatch":
            return False
        raise
    return True


class _Renewal:
    """Renews a message's lease at half of it while the function runs (Update Message, a new
    pop receipt each time); ``stop`` returns the message with its last pop receipt."""

    def __init__(self, queue: QueueClient, message: StoredMessage, lease: timedelta) -> None:
        self._queue, self._message, self._lease = queue, message, lease
        self.message = message  # its pop receipt follows the renewals
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._lease.total_seconds() / 2):
            with self._lock:
                if self._stopped.is_set():
                    return
                try:
                    message, lease = self._message, int(self._lease.total_seconds())
                    renewed = self._queue.update_message(message.id, pop_receipt=message.pop_receipt,
                                                         visibility_timeout=lease)  # fmt: skip
                except (ResourceNotFoundError, HttpResponseError):  # the lease was lost: the delete will say so
                    return
                self._message.pop_receipt = renewed.pop_receipt
                self._message.next_visible_on = renewed.next_visible_on

    def stop(self) -> StoredMessage:
        with self._lock:
            self._stopped.set()
        self._thread.join()
        return self._message
