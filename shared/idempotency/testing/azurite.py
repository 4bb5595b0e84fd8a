"""Start and stop a real Azurite service (Table by default; Queue, Blob) on a free port: the one
``npm ci`` installed in lab/node_modules (``make install`` does), else the one on the PATH."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft; not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, from Linux /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on ``port`` (Linux /proc): an emulator
    restarted on its port must not take another's, that took the port in between, for itself."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def installed(tool: str) -> str:
    """The npm tool's executable: lab/node_modules/.bin of the project the tests run in (the
    working directory or a parent of it), else on the PATH."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        binary = folder / "lab" / "node_modules" / ".bin" / tool
        if binary.exists():
            return str(binary)
    found = shutil.which(tool)
    if found is None:
        raise RuntimeError(f"{tool} is not installed: run `npm ci` in lab/ (make install does)")
    return found


class NotListening(RuntimeError):
    """The emulator exited, or did not listen in time."""


def start_listening(tool: str, args: list[str], port: int, timeout: float) -> subprocess.Popen[bytes]:
    """Start an npm-installed emulator and wait until it accepts connections on ``port``."""
    binary = installed(tool)
    process = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise NotListening(f"{tool} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            time.sleep(0.05)
            continue
        if listens(process.pid, port):
            return process
        time.sleep(0.05)  # another process answers there (it took the port while it was free)
    process.kill()
    process.wait()
    raise NotListening(f"{tool} did not listen on port {port} within {timeout}s")


class Azurite:
    """One Azurite process of ``service`` ("table", "queue" or "blob"). With ``location`` the
    data survives ``restart()``."""

    def __init__(self, location: Path | None = None, port: int | None = None, service: str = "table") -> None:
        self.location = location
        self.port = port or free_port()
        self.service = service
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"{self.service.capitalize()}Endpoint=http://127.0.0.1:{self.port}/{ACCOUNT};"
        )

    def start(self, timeout: float = 120.0) -> Azurite:
        """Start it and wait until it listens. A start that fails — the port not released yet after a
        stop, its data loaded slowly on a loaded machine — is tried again until ``timeout``."""
        storage = ["--location", str(self.location)] if self.location else ["--inMemoryPersistence"]
        where = [f"--{self.service}Host", "127.0.0.1", f"--{self.service}Port", str(self.port)]
        flags = ["--skipApiVersionCheck", "--disableTelemetry", "--silent"]  # the SDKs may speak a newer version
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._process = start_listening(f"azurite-{self.service}", [*where, *storage, *flags], self.port,
                                                max(left, 1.0))  # fmt: skip
                return self
            except NotListening:
                if left <= 1.0:
                    raise
                time.sleep(0.5)

    def outage(self, seconds: float) -> str | None:
        """Stop it, keep it down ``seconds``, start it again: None, or why it did not come back (a
        chaos run's fault, reported as its verdict, never a crash of the run)."""
        self.stop()
        time.sleep(seconds)
        try:
            self.start()
        except RuntimeError as exc:
            return f"the store did not come back after a {seconds:g} s outage: {exc}"
        return None

    def listening(self, timeout: float) -> bool:
        """Whether it accepts connections within ``timeout`` (a check after a run waits for a restart)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGINT, which makes Azurite flush its database. Azurite persists with a 5 s
        autosave, so SIGKILL would lose writes it had acknowledged — a durability that
        Azure Storage guarantees and the emulator does not; an outage test must not
        mistake that for a consumer bug."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def cpu_seconds(self) -> float:
        """CPU time the Azurite process has used so far, for the benchmark's split of each
        message's cost between the client and the store."""
        assert self._process is not None, "Azurite is not running"
        return process_cpu_seconds(self._process.pid)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
