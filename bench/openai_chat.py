"""Streamed chat over OpenAI's API next to the same model over /generate_stream: requests/s,
time to first token and inter-token latency (p50/p99), and the server's CPU per token, at
each concurrency. The difference per token is what the OpenAI layer costs.

Starts ``tritium serve`` on a temporary repository holding the test suite's text model
(tests/models/text_words.py: decoupled, one response per word, ``--step-ms`` apart) with a
Hugging Face chat template. Clients are raw keep-alive sockets; an event's time is when the
bytes holding it arrived.

    python bench/openai_chat.py [--seconds 5] [--concurrency 1 16] [--tokens 64] [--step-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import cpu_seconds
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

MODEL = "chat_words"
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
PROMPT = "the quick brown fox jumps over the lazy dog"
# Per path: request path, body, and the bytes that mark an event carrying a token.
PATHS = {
    "openai chat": ("/v1/chat/completions", lambda tokens: {
        "model": MODEL, "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": PROMPT}]}, b'"content":"'),
    "generate_stream": (f"/v2/models/{MODEL}/generate_stream", lambda tokens: {
        "text_input": PROMPT, "max_tokens": tokens}, b'"text_output"'),
}


def repository(root: Path, step_ms: int) -> Path:
    config = (DECOUPLED + _tensor("input", "text_input", "BYTES", "1")
              + _tensor("input", "max_tokens", "INT32", "1", " optional: true")
              + _tensor("output", "text_output", "BYTES", "1")
              + _tensor("output", "num_input_tokens", "UINT32", "1")
              + _tensor("output", "num_output_tokens", "UINT32", "1")
              + "instance_group [{ count: 2 }]\n" + _parameter("step_ms", str(step_ms)))
    model_dir = add_model(root, MODEL, "text_words", config)
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return root


class Timings:
    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.first: list[float] = []
        self.between: list[float] = []


async def one_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      request: bytes, marker: bytes, timings: Timings) -> None:
    started = time.perf_counter()
    writer.write(request)
    last: float | None = None
    buffer = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        now = time.perf_counter()
        buffer += chunk
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            if marker not in event or marker + b'"' in event:  # no token (role, end)
                continue
            timings.tokens += 1
            if last is None:
                timings.first.append(now - started)
            else:
                timings.between.append(now - last)
            last = now
        if buffer.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's last chunk
            break
    timings.requests += 1


async def worker(port: int, request: bytes, marker: bytes, deadline: float,
                 timings: Timings) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            await one_request(reader, writer, request, marker, timings)
    finally:
        writer.close()


async def run(port: int, path: str, tokens: int, concurrency: int, seconds: float) -> Timings:
    target, make_body, marker = PATHS[path]
    body = json.dumps(make_body(tokens)).encode()
    request = (f"POST {target} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    timings = Timings()
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(worker(port, request, marker, deadline, timings)
                           for _ in range(concurrency)))
    return timings


def report(path: str, concurrency: int, timings: Timings, wall: float, cpu: float) -> str:
    first = np.array(timings.first) * 1e3
    between = np.array(timings.between or [0.0]) * 1e3
    return (f"{path:16s} c={concurrency:<3d} {timings.requests / wall:7.1f} req/s  "
            f"{timings.tokens / wall:8.0f} tok/s  "
            f"TTFT p50 {np.percentile(first, 50):7.2f} p99 {np.percentile(first, 99):7.2f} ms  "
            f"ITL p50 {np.percentile(between, 50):6.3f} p99 {np.percentile(between, 99):6.3f} ms"
            f"  server CPU {cpu / max(timings.tokens, 1) * 1e6:6.1f} µs/token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--step-ms", type=int, default=0, help="the model's delay per token")
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        server = TritiumProcess(repository(Path(tmp), args.step_ms)).start()
        try:
            for concurrency in args.concurrency:
                for path in PATHS:
                    uvloop.run(run(server.http_port, path, args.tokens, concurrency, 0.5))
                    cpu = cpu_seconds(server.pid)
                    wall = time.perf_counter()
                    timings = uvloop.run(run(server.http_port, path, args.tokens,
                                             concurrency, args.seconds))
                    wall = time.perf_counter() - wall
                    cpu = cpu_seconds(server.pid) - cpu
                    print(report(path, concurrency, timings, wall, cpu), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
