"""The Functions face: the only part of the library that imports ``azure.functions`` (the
``functions`` extra). A consumer module declares its consumer with ``@consumer`` and makes
each function's body one call:

    @consumer
    def invoices() -> IdempotentConsumer:
        return IdempotentConsumer("invoices", shared_store(), record_invoice, schema=SCHEMA)

    @bp.service_bus_queue_trigger(arg_name="msg", queue_name="%INVOICES_QUEUE%",
                                  connection="ServiceBusConnection", data_type=BODY_AS_BYTES)
    def on_invoice(msg: func.ServiceBusMessage) -> None:
        on_servicebus(invoices, msg)

- one call per trigger: ``on_servicebus``, ``on_servicebus_batch``, ``on_storage_queue``, ``on_eventgrid``,
  ``on_http`` (``Idempotency-Key``), ``on_cloudevents_http``, ``on_eventhub_batch`` (park
  on the last try), ``on_schedule`` (a timer's occurrence, each item once), ``on_blob_import``
  (a file's records, each once); ``BODY_AS_BYTES``
  for the Service Bus triggers, ``stored_response`` for what an HTTP handler answers; a
  refused settlement raises ``RetryLater`` (the host abandons or retries);
- the app's consumers, their store and their outbox sender: ``consumer``, ``shared_store``,
  ``shared_sender`` (a ``ServiceBusSender``); ``check_app_settings`` (every setting, checked
  when the app starts);
- ``housekeeping`` (``housekeeping(needs)``): the store's housekeeping timers an app registers
  once (purge expired markers; with ``"steps"`` reconcile stale claims; with ``"outbox"``
  sweep the outbox).

One module per source (``_servicebus``, ``_storage_queue``, ``_eventgrid``, ``_eventhubs``, ``_http``,
``_cloudevents_http``, ``_schedule``, ``_blob``), each opening with its ``on_*`` call. Building blocks for
a trigger of your own are in ``.adapters``; the app's declared consumers, for operators' tools,
in ``.registry``.
"""

from ._app import check_app_settings, consumer, shared_sender, shared_store
from ._blob import on_blob_import
from ._cloudevents_http import on_cloudevents_http
from ._eventgrid import on_eventgrid
from ._eventhubs import on_eventhub_batch
from ._housekeeping import housekeeping
from ._http import on_http, stored_response
from ._schedule import on_schedule
from ._senders import ServiceBusSender
from ._servicebus import BODY_AS_BYTES, on_servicebus, on_servicebus_batch
from ._settle import RetryLater
from ._storage_queue import on_storage_queue

__all__ = [
    "BODY_AS_BYTES",
    "RetryLater",
    "ServiceBusSender",
    "check_app_settings",
    "consumer",
    "housekeeping",
    "on_blob_import",
    "on_cloudevents_http",
    "on_eventgrid",
    "on_eventhub_batch",
    "on_http",
    "on_schedule",
    "on_servicebus",
    "on_servicebus_batch",
    "on_storage_queue",
    "shared_sender",
    "shared_store",
    "stored_response",
]
