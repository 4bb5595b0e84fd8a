"""The Functions host's side of the FunctionRpc gRPC stream, played against one real Python
worker process: start it as the host does, then StartStream → WorkerInitRequest →
FunctionsMetadataRequest → FunctionLoadRequest → InvocationRequest (or, for the Flex/Linux
Consumption start path, a placeholder worker specialised by FunctionEnvironmentReloadRequest).

The protocol follows Azure/azure-functions-host src/WebJobs.Script.Grpc/Channel/GrpcWorkerChannel.cs
(the message order, and the capabilities the host announces) and the worker's FunctionRpc.proto.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from lab.runtime.build import CACHE, HOST_STUBS, PACKAGES, Runtime
from lab.runtime.triggers import Invocation, typed
from shared.idempotency.testing.azurite import process_cpu_seconds

HOST_VERSION = "4.1037.0"  # reported to the worker, which only logs it
MAX_MESSAGE = 2_147_483_647  # the host's --grpcMaxMessageLength
TIMEOUT = 120.0
AZURE_APP_ROOT = Path("/home/site/wwwroot")  # where worker.py looks for the app on Azure
# Run in a private mount namespace (root only): a tmpfs over /home, the given folder at
# /home/site/wwwroot, then the worker there. Nothing outside the worker process sees it.
MOUNT_APP_ROOT = (
    'mount -t tmpfs none /home && mkdir -p /home/site/wwwroot && mount --bind "$0" /home/site/wwwroot'
    ' && cd /home/site/wwwroot && exec "$@"'
)
# What a v4 host announces in WorkerInitRequest (host src/WebJobs.Script.Grpc/Channel/
# GrpcWorkerChannel.cs, SendWorkerInitRequest); HostVersion and the directories are set beside it.
HOST_CAPABILITIES = {"MultiStream": "10"}


def rpc() -> tuple[ModuleType, ModuleType]:
    """FunctionRpc_pb2 and FunctionRpc_pb2_grpc, generated from the worker's own .proto files
    (lab/runtime/build.py copies them to .runtime/host-stubs-<version>/functionrpc)."""
    stubs = HOST_STUBS
    if str(stubs) not in sys.path:
        sys.path.append(str(stubs))
    return importlib.import_module("functionrpc.FunctionRpc_pb2"), importlib.import_module(
        "functionrpc.FunctionRpc_pb2_grpc"
    )


@dataclass
class WorkerLog:
    category: str
    level: int
    message: str
    invocation_id: str
    exception: str = ""


@dataclass
class Function:
    function_id: str
    name: str
    metadata: Any  # RpcFunctionMetadata as the worker indexed it
    bindings: list[dict[str, Any]] = field(default_factory=list)  # raw_bindings, parsed


class WorkerHost:
    """One worker process and its gRPC stream. ``settings`` are the app settings the host
    passes as environment variables. With ``placeholder=True`` the worker starts as on a
    Flex/Linux Consumption placeholder and is specialised by ``specialize()``."""

    def __init__(
        self,
        runtime: Runtime,
        settings: Mapping[str, str],
        *,
        placeholder: bool = False,
        on_log: Callable[[WorkerLog], None] | None = None,
        hash_seed: str = "",
    ) -> None:
        self.runtime = runtime
        self.settings = dict(settings)
        self.placeholder = placeholder
        self.on_log = on_log
        self.hash_seed = hash_seed  # fixes the worker's set iteration order (see the placeholder test)
        self.pb, self._grpc = rpc()
        self.logs: list[WorkerLog] = []
        self.functions: dict[str, Function] = {}
        self.request_id = str(uuid.uuid4())
        self.worker_id = str(uuid.uuid4())
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._pending: dict[str, futures.Future[Any]] = {}
        self._mutex = threading.Lock()
        self._started = threading.Event()
        self._server: grpc.Server | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.output = CACHE / f"worker-{self.worker_id[:8]}.log"
        # A placeholder runs as on Azure (CONTAINER_NAME set, so worker.py takes its Azure path
        # and expects the app at /home/site/wwwroot) before the app's content is there: an empty
        # folder mounted at that path in the worker's own mount namespace, filled by specialize().
        self.app = AZURE_APP_ROOT if placeholder else runtime.app
        self._mount = CACHE / f"site-{self.worker_id[:8]}"

    # -- process and stream ------------------------------------------------------------------

    def start(self) -> WorkerHost:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)],
        )
        handler = type("Host", (self._grpc.FunctionRpcServicer,), {"EventStream": self._event_stream})()
        self._grpc.add_FunctionRpcServicer_to_server(handler, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        command = self._command(port)
        if self.placeholder:
            self._mount.mkdir(parents=True, exist_ok=True)
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_APP_ROOT,
                       str(self._mount), *command]  # fmt: skip
        with self.output.open("wb") as output:
            self._process = subprocess.Popen(
                command, cwd=self.runtime.app, env=self._environment(), stdout=output, stderr=subprocess.STDOUT
            )
        if not self._started.wait(TIMEOUT) or self._process.poll() is not None:
            self.close()
            raise RuntimeError(f"the worker did not open its stream; its output:\n{self.worker_output()}")
        return self

    def _command(self, port: int) -> list[str]:
        """As the host's worker process factory starts it: the worker path from
        worker.config.json, then both the old and the new argument names."""
        ids = ["--workerId", self.worker_id, "--requestId", self.request_id]
        return [
            str(self.runtime.python), str(self.runtime.worker / "worker.py"), "--host", "127.0.0.1",
            "--port", str(port), *ids, "--grpcMaxMessageLength", str(MAX_MESSAGE),
            "--functions-uri", f"http://127.0.0.1:{port}/", "--functions-worker-id", self.worker_id,
            "--functions-request-id", self.request_id, "--functions-grpc-max-message-length", str(MAX_MESSAGE),
        ]  # fmt: skip

    def _environment(self) -> dict[str, str]:
        """What the host hands its worker on Linux: its own environment (a few basics here)
        plus the app settings, and the PYTHONPATH worker.py computes on Azure
        (the app's .python_packages first, then the worker's own folder)."""
        base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TZ") if name in os.environ}
        env = {
            **base,
            "FUNCTIONS_WORKER_RUNTIME": "python",
            "AzureWebJobsScriptRoot": str(self.app),
            "PYTHONPATH": f"{self.app / PACKAGES}:{self.runtime.worker}",
            "PYTHONUNBUFFERED": "1",
            **({"PYTHONHASHSEED": self.hash_seed} if self.hash_seed else {}),
        }
        if self.placeholder:
            # no app settings yet: they arrive with FunctionEnvironmentReloadRequest
            return {**env, "WEBSITE_PLACEHOLDER_MODE": "1", "CONTAINER_NAME": "placeholder"}
        return {**env, **self.settings}

    def _event_stream(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        threading.Thread(target=self._receive, args=(requests,), name="host-receive", daemon=True).start()
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def _receive(self, requests: Iterator[Any]) -> None:
        try:
            for message in requests:
                self._dispatch(message)
        except grpc.RpcError:
            pass  # the stream ended: the worker exited or we closed it
        with self._mutex:
            for waiting in self._pending.values():
                waiting.set_exception(RuntimeError(f"the worker's stream ended; its output:\n{self.worker_output()}"))
            self._pending.clear()

    def _dispatch(self, message: Any) -> None:
        kind = message.WhichOneof("content")
        if kind == "start_stream":
            self._started.set()
        elif kind == "rpc_log":
            log = message.rpc_log
            entry = WorkerLog(log.category, log.level, log.message, log.invocation_id, log.exception.message)
            self.logs.append(entry)
            if self.on_log is not None:
                self.on_log(entry)
        else:
            payload = getattr(message, kind)
            key = payload.invocation_id if kind == "invocation_response" else kind
            if kind == "function_load_response":
                key = f"{kind}:{payload.function_id}"
            with self._mutex:
                waiting = self._pending.pop(key, None)
            if waiting is not None:
                waiting.set_result(payload)

    def _request(self, key: str, **content: Any) -> Any:
        waiting: futures.Future[Any] = futures.Future()
        with self._mutex:
            self._pending[key] = waiting
        self._outbox.put(self.pb.StreamingMessage(request_id=self.request_id, **content))
        return waiting.result(TIMEOUT)

    def close(self) -> None:
        self._outbox.put(None)
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._server is not None:
            self._server.stop(grace=None)
        shutil.rmtree(self._mount, ignore_errors=True)

    def cpu_seconds(self) -> float:
        """CPU time the worker process has used so far: for lab/bench/worker.py's split of each
        message's cost."""
        assert self._process is not None, "the worker is not running"
        return process_cpu_seconds(self._process.pid)

    def worker_output(self) -> str:
        return self.output.read_text(errors="replace")[-5000:] if self.output.exists() else ""

    def __enter__(self) -> WorkerHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the host's requests -----------------------------------------------------------------

    def init(self) -> Any:
        """WorkerInitRequest with the capabilities a v4 host announces."""
        request = self.pb.WorkerInitRequest(
            host_version=HOST_VERSION,
            worker_directory=str(self.runtime.worker),
            function_app_directory=str(self.app),
            capabilities=HOST_CAPABILITIES,
        )
        return self._request("worker_init_response", worker_init_request=request)

    def specialize(self) -> Any:
        """FunctionEnvironmentReloadRequest: the placeholder becomes this app, with its settings."""
        for entry in self.runtime.app.iterdir():  # the content arrives at /home/site/wwwroot
            (self._mount / entry.name).symlink_to(entry)
        env = {**self._environment(), **self.settings, "WEBSITE_PLACEHOLDER_MODE": "0"}
        request = self.pb.FunctionEnvironmentReloadRequest(
            environment_variables=env, function_app_directory=str(self.app)
        )
        return self._request("function_environment_reload_response", function_environment_reload_request=request)

    def index(self) -> Any:
        """FunctionsMetadataRequest: the worker imports function_app.py and indexes it."""
        request = self.pb.FunctionsMetadataRequest(function_app_directory=str(self.app))
        response = self._request("function_metadata_response", functions_metadata_request=request)
        for metadata in response.function_metadata_results:
            bindings = [json.loads(raw) for raw in metadata.raw_bindings]
            self.functions[metadata.name] = Function(metadata.function_id, metadata.name, metadata, bindings)
        return response

    def load(self, name: str) -> Any:
        function = self.functions[name]
        request = self.pb.FunctionLoadRequest(function_id=function.function_id, metadata=function.metadata)
        return self._request(f"function_load_response:{function.function_id}", function_load_request=request)

    def start_app(self) -> WorkerHost:
        """The whole start sequence; raises when any step fails."""
        for step in (self.init, *((self.specialize,) if self.placeholder else ()), self.index):
            response = step()
            if response.result.status != self.pb.StatusResult.Success:
                raise RuntimeError(f"{step.__name__} failed: {self.exception(response)}")
        for name in self.functions:
            loaded = self.load(name)
            if loaded.result.status != self.pb.StatusResult.Success:
                raise RuntimeError(f"loading {name} failed: {self.exception(loaded)}")
        return self

    def invoke(self, name: str, invocation: Invocation, *, retry: tuple[int, int] | None = None) -> Any:
        """InvocationRequest as host src/WebJobs.Script.Grpc/Extensions/
        ScriptInvocationContextExtensions.cs ToRpcInvocationRequest builds it: one
        ParameterBinding per input, the binding data as trigger_metadata, the Activity's trace
        context; a RetryContext (retry count, max retry count) for a function with a retry policy."""
        invocation_id = str(uuid.uuid4())
        request = self.pb.InvocationRequest(
            invocation_id=invocation_id,
            function_id=self.functions[name].function_id,
            input_data=[
                self.pb.ParameterBinding(name=key, data=typed(self.pb, value))
                for key, value in invocation.inputs.items()
            ],
            trigger_metadata={key: typed(self.pb, value) for key, value in invocation.metadata.items()},
            trace_context=self.pb.RpcTraceContext(trace_parent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"),
        )
        if retry is not None:
            request.retry_context.CopyFrom(self.pb.RetryContext(retry_count=retry[0], max_retry_count=retry[1]))
        return self._request(invocation_id, invocation_request=request)

    def trigger(self, name: str) -> dict[str, Any]:
        """The function's trigger binding, as the worker indexed it."""
        return next(b for b in self.functions[name].bindings if str(b["type"]).endswith("Trigger"))

    @staticmethod
    def exception(response: Any) -> str:
        error = response.result.exception
        return f"{error.message}\n{error.stack_trace}".strip()

    def failed(self, response: Any) -> str | None:
        """The exception text of a failed invocation, None on success."""
        if response.result.status == self.pb.StatusResult.Success:
            return None
        return str(response.result.exception.message)


def log_level(level: int) -> int:
    """RpcLog.Level → logging level."""
    return {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING}.get(level, logging.ERROR)
