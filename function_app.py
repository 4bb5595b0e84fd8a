"""Azure Functions entry point (Python v2 programming model): the app registers the
Blueprint of every module in consumers/ and the store's housekeeping timers they need. Each
function is thin — binding → dedup module → settlement; the flow lives in shared/idempotency."""

from __future__ import annotations

import logging
import os
import sys

import azure.functions as func

import consumers
from shared.idempotency.functions import check_app_settings, housekeeping

# The worker logs at INFO: keep the SDKs' per-request HTTP logging out of the app's logs.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)


def ensure_telemetry() -> None:
    """On Azure the worker configures OpenTelemetry with the Azure Monitor distro (host.json
    "telemetryMode", PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY / PYTHON_ENABLE_OPENTELEMETRY),
    and the dedup module reports through the OpenTelemetry API. Worker 4.34 cannot when it
    starts directly with PYTHON_ISOLATE_WORKER_DEPENDENCIES (it imports the distro before the
    app's packages are on its path; a Flex placeholder's specialisation can): then, and only
    then, the app configures it, the same way — one telemetry stream either way."""
    from opentelemetry import trace

    wanted = os.environ.get("PYTHON_ENABLE_OPENTELEMETRY", "").lower() == "true"
    if wanted and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        log = logging.getLogger("idempotency")
        try:
            from azure.monitor.opentelemetry import configure_azure_monitor

            configure_azure_monitor()  # Entra ID ingestion from APPLICATIONINSIGHTS_AUTHENTICATION_STRING
        except Exception:  # telemetry must never keep the functions from loading
            log.exception("telemetry: Azure Monitor could not be configured; the functions run without it")
            return
        log.info("telemetry: Azure Monitor configured by the app (not by the worker)")


ensure_telemetry()
# loaded by a Functions worker (azure_functions_runtime behind the proxy on 3.13+): bad settings fail the start
if not {"azure_functions_worker", "azure_functions_runtime"}.isdisjoint(sys.modules):
    check_app_settings()
app = func.FunctionApp()
blueprints = consumers.blueprints()
for blueprint in [*blueprints, *housekeeping(consumers.needs(), watched=blueprints)]:
    app.register_functions(blueprint)
