"""A TCP proxy that adds a fixed one-way delay to every byte it forwards, in each direction,
so that a benchmark on loopback sees the round trips of a real network (``make bench``).

    python -m lab.delay_proxy --target 127.0.0.1:10002 --delay-ms 4

Prints the port it listens on, then serves until killed. Each chunk is forwarded
``delay`` after it arrived, without holding up the chunks behind it (a latency, not a
bandwidth limit)."""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while data := await reader.read(65536):
            chunks.put_nowait((time.monotonic() + delay, data))
        chunks.put_nowait((0.0, b""))

    receiving = asyncio.create_task(receive())
    try:
        while True:
            due, data = await chunks.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        receiving.cancel()
        writer.close()


async def _serve(target: tuple[str, int], delay: float, listener: socket.socket) -> None:
    async def connect(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pump(client_reader, upstream_writer, delay), _pump(upstream_reader, client_writer, delay),
                             return_exceptions=True)  # fmt: skip

    server = await asyncio.start_server(connect, sock=listener)
    async with server:
        await server.serve_forever()


@contextmanager
def delayed(target_port: int, delay_ms: float) -> Iterator[int]:
    """The proxy in a process of its own (its CPU is not the client's); yields its port."""
    if delay_ms <= 0:
        yield target_port
        return
    process = subprocess.Popen([sys.executable, "-m", "lab.delay_proxy", "--target", f"127.0.0.1:{target_port}",
                                "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline())
    finally:
        process.terminate()
        process.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    args = parser.parse_args(argv)
    host, port = args.target.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    asyncio.run(_serve((host, int(port)), args.delay_ms / 1000, listener))
    return 0


if __name__ == "__main__":
    sys.exit(main())
