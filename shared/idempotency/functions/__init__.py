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

- one call per trigger: ``on_servicebus``, ``on_servicebus_batch``, ``on_eventgrid``,
  ``on_http`` (``Idempotency-Key``), ``on_cloudevents_http``, ``on_eventhub_batch`` (park
  on the last try), ``on_schedule`` (a timer's
  occurrence, each item once); ``BODY_AS_BYTES`` for the
  Service Bus triggers, ``stored_response`` for what an HTTP handler answers;
- the app's consumers, their store and their outbox sender: ``consumer``, ``shared_store``,
  ``shared_sender`` (a ``ServiceBusSender``), ``declared`` (with a package: after importing
  each of its modules), ``declared_consumer`` (for
  operators' tools), ``reset``, ``using_store``, ``using_sender``; ``check_app_settings``
  (every setting, checked when the app starts);
- ``housekeeping`` (``housekeeping(needs)``): the store's housekeeping timers an app registers once (purge
  expired markers; with ``"steps"`` reconcile stale claims; with ``"outbox"`` sweep the outbox);
- for a trigger of your own: the deliveries (``servicebus_delivery``, ``eventgrid_delivery``,
  ``eventhub_deliveries``,
  ``cloudevent_delivery``, ``http_delivery``, ``http_cloudevent_delivery``) and settlements
  (``acknowledge_or_retry`` and ``RetryLater``, ``http_response``, ``cloudevent_response``,
  ``problem``, ``REPLAYED``); how long an Event Grid delivery and an HTTP request wait for a
  transient failure inside the call (``EVENT_GRID_WAIT``, ``HTTP_WAIT``).
"""

from ._bindings import (
    BODY_AS_BYTES,
    EVENT_GRID_WAIT,
    HTTP_WAIT,
    REPLAYED,
    RetryLater,
    acknowledge_or_retry,
    cloudevent_delivery,
    cloudevent_response,
    eventgrid_delivery,
    eventhub_deliveries,
    http_cloudevent_delivery,
    http_delivery,
    http_response,
    on_cloudevents_http,
    on_eventgrid,
    on_eventhub_batch,
    on_http,
    on_schedule,
    on_servicebus,
    on_servicebus_batch,
    problem,
    servicebus_delivery,
    stored_response,
)
from ._registry import (
    check_app_settings,
    consumer,
    declared,
    declared_consumer,
    reset,
    shared_sender,
    shared_store,
    using_sender,
    using_store,
)
from ._senders import ServiceBusSender
from ._timers import housekeeping

__all__ = [
    "BODY_AS_BYTES",
    "EVENT_GRID_WAIT",
    "HTTP_WAIT",
    "REPLAYED",
    "RetryLater",
    "ServiceBusSender",
    "acknowledge_or_retry",
    "check_app_settings",
    "cloudevent_delivery",
    "cloudevent_response",
    "consumer",
    "declared",
    "declared_consumer",
    "eventgrid_delivery",
    "eventhub_deliveries",
    "housekeeping",
    "http_cloudevent_delivery",
    "http_delivery",
    "http_response",
    "on_cloudevents_http",
    "on_eventgrid",
    "on_eventhub_batch",
    "on_http",
    "on_schedule",
    "on_servicebus",
    "on_servicebus_batch",
    "problem",
    "reset",
    "servicebus_delivery",
    "shared_sender",
    "shared_store",
    "stored_response",
    "using_sender",
    "using_store",
]
