"""Events per second that /generate_stream delivers from a model sending as fast as it can.

Starts ``tritium serve`` on a temporary repository holding the test suite's ``repeat``
model (decoupled, one response per index, no delay) and reads the SSE stream with a raw
socket, counting ``data:`` events.

    python bench/generate_stream.py [--events 50000] [--streams 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import cpu_seconds
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, add_model

CONFIG = (DECOUPLED
          + 'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1] }, '
          + '{ name: "DELAY" data_type: TYPE_FP32 dims: [1] optional: true }]\n'
          + 'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [1] }]\n'
          + "instance_group [{ count: 4 }]\n")


async def stream(port: int, events: int) -> int:
    body = b'{"INPUT0": %d}' % events
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: b\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    seen = 0
    tail = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data = tail + chunk
        seen += data.count(b"data: ")
        tail = data[-8:]
        seen -= tail.count(b"data: ")  # counted again with the next chunk
        if data.endswith(b"0\r\n\r\n"):
            break
    writer.close()
    return seen + tail.count(b"data: ")


async def run(port: int, events: int, streams: int) -> int:
    counts = await asyncio.gather(*(stream(port, events) for _ in range(streams)))
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50000)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        add_model(repo, "repeat", "repeat", CONFIG)
        server = TritiumProcess(repo).start()
        try:
            uvloop.run(run(server.http_port, 1000, 1))  # warm up
            for streams in args.streams:
                cpu = cpu_seconds(server.pid)
                started = time.perf_counter()
                total = uvloop.run(run(server.http_port, args.events, streams))
                wall = time.perf_counter() - started
                cpu = cpu_seconds(server.pid) - cpu
                print(f"generate_stream  streams={streams:<2d} {total / wall:9.0f} events/s  "
                      f"server CPU {cpu / total * 1e6:6.1f} µs/event  ({total} events)",
                      flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
