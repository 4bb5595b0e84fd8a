"""Building blocks for a trigger of your own (the one-call ``on_*`` functions are made of
them): turn what the trigger receives into a ``Delivery``, give it to the consumer, settle
its ``Result``.

- deliveries: ``servicebus_delivery``, ``eventgrid_delivery``, ``eventhub_deliveries``,
  ``cloudevent_delivery``, ``http_delivery`` (``Idempotency-Key``),
  ``http_cloudevent_delivery``;
- settlements: ``acknowledge_or_retry`` (return, or raise ``RetryLater`` for the host to
  retry), ``http_response`` (replays carry the ``REPLAYED`` header), ``cloudevent_response``,
  ``problem`` (an RFC 9457 answer);
- how long an HTTP request and an Event Grid delivery wait for a transient failure inside
  the call: ``HTTP_WAIT``, ``EVENT_GRID_WAIT``.
"""

from ._bindings import (
    EVENT_GRID_WAIT,
    HTTP_WAIT,
    REPLAYED,
    acknowledge_or_retry,
    cloudevent_delivery,
    cloudevent_response,
    eventgrid_delivery,
    eventhub_deliveries,
    http_cloudevent_delivery,
    http_delivery,
    http_response,
    problem,
    servicebus_delivery,
)

__all__ = [
    "EVENT_GRID_WAIT",
    "HTTP_WAIT",
    "REPLAYED",
    "acknowledge_or_retry",
    "cloudevent_delivery",
    "cloudevent_response",
    "eventgrid_delivery",
    "eventhub_deliveries",
    "http_cloudevent_delivery",
    "http_delivery",
    "http_response",
    "problem",
    "servicebus_delivery",
]
