"""Building blocks for a trigger of your own (the one-call ``on_*`` functions are made of
them): turn what the trigger receives into a ``Delivery``, give it to the consumer, settle
its ``Result``.

- deliveries: ``servicebus_delivery``, ``storage_queue_delivery``, ``eventgrid_delivery``, ``eventhub_deliveries`` (an
  event's place in its hub: ``event_position``), ``cloudevent_delivery``, ``http_delivery`` (``Idempotency-Key``),
  ``http_cloudevent_delivery``;
- settlements: ``acknowledge_or_retry`` (return, or raise ``RetryLater`` for the host to
  retry), ``http_response`` (replays carry the ``REPLAYED`` header), ``cloudevent_response``,
  ``problem`` (an RFC 9457 answer);
- how long an HTTP request and an Event Grid delivery wait for a transient failure inside
  the call: ``HTTP_WAIT``, ``EVENT_GRID_WAIT``.
"""

from ._cloudevents_http import cloudevent_response, http_cloudevent_delivery
from ._eventgrid import EVENT_GRID_WAIT, cloudevent_delivery, eventgrid_delivery
from ._eventhubs import event_position, eventhub_deliveries
from ._http import HTTP_WAIT, REPLAYED, http_delivery, http_response, problem
from ._servicebus import servicebus_delivery
from ._settle import acknowledge_or_retry
from ._storage_queue import storage_queue_delivery

__all__ = [
    "EVENT_GRID_WAIT",
    "HTTP_WAIT",
    "REPLAYED",
    "acknowledge_or_retry",
    "cloudevent_delivery",
    "cloudevent_response",
    "event_position",
    "eventgrid_delivery",
    "eventhub_deliveries",
    "http_cloudevent_delivery",
    "http_delivery",
    "http_response",
    "problem",
    "servicebus_delivery",
    "storage_queue_delivery",
]
