"""A local stand-in for the Functions host's Python 3.13+ proxy worker (Azure/azure-functions-python-worker
workers/proxy_worker): connect to the host's FunctionRpc server, send StartStream, and hand each request
to azure_functions_runtime, whose responses go back on the stream; the root logger's records go as RpcLog.
Started as the host starts worker.py (same arguments); the stubs are the worker release's .proto files
(package ``proxy_worker.protos`` beside this file, as the proxy names it)."""

import argparse
import asyncio
import contextvars
import logging
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Any

import grpc
from proxy_worker import protos  # the module the proxy hands the runtime (its protos/__init__.py)

SYSTEM = ("proxy_worker", "azure_functions_runtime", "azure.functions")  # proxy_worker/logging.py
HANDLED = {"worker_init_request", "function_environment_reload_request", "functions_metadata_request",
           "function_load_request", "invocation_request"}  # fmt: skip
log = logging.getLogger("proxy_worker")
HERE = os.path.dirname(os.path.realpath(__file__))  # as sys.path[0] has it: symlinks resolved
invocation = contextvars.ContextVar("invocation", default=None)  # for async functions (task-local)
runtime: Any = None  # azure_functions_runtime, imported at the first init/reload as the proxy does


@dataclass
class WorkerRequest:  # proxy_worker/dispatcher.py: what every runtime handler receives
    name: str
    request: Any  # the StreamingMessage
    properties: dict[str, Any] | None = None


class Relay(logging.Handler):
    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.args, self.loop = args, loop
        self.outbox: queue.Queue[Any] = queue.Queue()

    def send(self, **content: Any) -> None:
        self.outbox.put(protos.StreamingMessage(request_id=self.args.request_id, **content))

    def emit(self, record: logging.LogRecord) -> None:  # proxy: AsyncLoggingHandler / Dispatcher.on_logging
        level = min(5, max(1, record.levelno // 10))  # DEBUG..CRITICAL -> Debug(1)..Critical(5)
        current = (runtime.invocation_id_cv.get() if runtime else None) or invocation.get()
        category = protos.RpcLog.System if record.name.startswith(SYSTEM) else protos.RpcLog.User
        self.send(rpc_log=protos.RpcLog(level=level, message=self.format(record), category=record.name,
                                        log_category=category, invocation_id=current or ""))  # fmt: skip

    def poll(self, done: asyncio.Future[None]) -> None:  # the gRPC thread
        size = self.args.grpc_max_msg_len or -1
        options = [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size)]
        channel = grpc.insecure_channel(f"{self.args.host}:{self.args.port}", options)
        try:
            grpc.channel_ready_future(channel).result(timeout=5.0)  # the proxy's connect timeout
            self.send(start_stream=protos.StartStream(worker_id=self.args.worker_id))
            for message in protos.FunctionRpcStub(channel).EventStream(iter(self.outbox.get, None)):
                self.loop.call_soon_threadsafe(self.loop.create_task, self.dispatch(message))
        except grpc.RpcError:
            pass  # the host closed the stream
        finally:
            self.loop.call_soon_threadsafe(done.set_result, None)

    async def dispatch(self, message: Any) -> None:
        try:
            await self._dispatch(message)
        except Exception:  # the host would wait for an answer: say why there is none
            log.exception("relaying %s failed", message.WhichOneof("content"))

    async def _dispatch(self, message: Any) -> None:
        global runtime
        kind = message.WhichOneof("content")
        if kind == "worker_status_request":
            return self.send(worker_status_response=protos.WorkerStatusResponse())
        if kind not in HANDLED:
            return log.warning("not relayed: %s", kind)
        properties = None
        if kind in ("worker_init_request", "function_environment_reload_request"):
            directory = getattr(message, kind).function_app_directory
            # DependencyManager.prioritize_customer_dependencies: the app's packages (PYTHONPATH) before
            # the worker's, the app's folder last
            if os.path.realpath(sys.path[0]) == HERE:
                sys.path.pop(0)
            if directory and directory not in sys.path:
                sys.path.append(directory)
            if kind == "function_environment_reload_request":  # ... which also forgets what the placeholder
                for name, module in list(sys.modules.items()):  # imported from the worker's folder
                    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), "")
                    kept = name.startswith(("proxy_worker", "grpc", "google"))
                    if where and os.path.realpath(where).startswith(HERE) and not kept:
                        del sys.modules[name]
            import azure_functions_runtime

            runtime = azure_functions_runtime
            runtime.start_threadpool_executor()
            properties = {"protos": protos, "host": self.args.host}
        if kind == "invocation_request":
            invocation.set(message.invocation_request.invocation_id)
        response = await getattr(runtime, kind)(WorkerRequest(kind, message, properties))
        answer = "function_metadata_response" if kind == "functions_metadata_request" else kind[:-7] + "response"
        self.send(**{answer: response})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--workerId", dest="worker_id")
    parser.add_argument("--requestId", dest="request_id")
    parser.add_argument("--grpcMaxMessageLength", type=int, dest="grpc_max_msg_len")
    args, _ = parser.parse_known_args()  # the --functions-* duplicates
    loop = asyncio.get_running_loop()
    relay, done = Relay(args, loop), loop.create_future()
    debug = os.environ.get("PYTHON_ENABLE_DEBUG_LOGGING", "").lower() in ("1", "true")
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.INFO)
    logging.getLogger().addHandler(relay)
    threading.Thread(target=relay.poll, args=(done,), name="grpc", daemon=True).start()
    await done


if __name__ == "__main__":
    asyncio.run(main())
