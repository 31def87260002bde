"""User-space CPU instructions the server executes per identity inference, HTTP and gRPC.

Timings on a small shared machine wander by 10-20 % from run to run; an instruction count
does not. This starts ``tritium serve`` with the bundled example identity model under valgrind's
callgrind, warms it up, zeroes the counters, sends N requests one at a time (HTTP: the binary
tensor extension over one keep-alive socket; gRPC: ModelInfer over one channel, with a
deadline, as perf_analyzer-like clients send), dumps the counters and divides. Every thread
of the server is counted (the event loop and the instance threads); the kernel's share
(system calls, wake-ups) is not.

    python bench/instructions.py [--requests 1000] [--protocols http grpc] [--tree PATH ...]
                                 [--trace triton|opentelemetry] [--kind thread|process]
                                 [--server-flag=--flag=value ...]

``--kind process`` serves python models in instance processes and counts every process of
the server (valgrind follows the guardians and instance processes it starts): the server,
the guardians and the instance processes together.

``--trace`` serves with tracing on at rate 1 (every request traced): the trace file in a
scratch directory, or OTLP/HTTP spans to a sink in this process, to state what tracing costs.

``--tree`` measures the ``src/`` of other checkouts too (e.g. a ``git worktree`` of an older
commit), one line each, for before/after comparisons in one run. Needs valgrind (Debian
package ``valgrind``); the server runs some 50x slower under it, so startup takes a while.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpc_infer
import http_infer
from driver import REPOSITORY, TritiumProcess, descendants

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 300
_CONTENT_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


def send_http(port: int, count: int) -> None:
    request = http_infer.request_bytes("identity", 16)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(count):
            sock.sendall(request)
            received = b""
            while True:
                piece = sock.recv(65536)
                if not piece:
                    raise ConnectionError("the server closed the connection")
                received += piece
                head, blank, body = received.partition(b"\r\n\r\n")
                if blank:
                    length = _CONTENT_LENGTH.search(head)
                    if length is not None and len(body) >= int(length.group(1)):
                        break


def send_grpc(url: str, count: int) -> None:
    payload = grpc_infer.request_bytes("identity", 16)
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(grpc_infer.METHOD)
        for _ in range(count):
            call(payload, timeout=60)


def dumped_instructions(directory: Path, pids: list[int]) -> int:
    """The counters that ``callgrind_control --dump`` wrote (not the ones written at exit)."""
    total = 0
    for dump in (d for pid in pids for d in directory.glob(f"callgrind.{pid}.*")):
        found = re.search(r"^summary: (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
        if found:
            total += int(found.group(1))
    return total


def trace_flags(mode: str | None, directory: Path) -> list[str]:
    """Server flags that trace every request in ``mode`` (none when None)."""
    if mode is None:
        return []
    flags = ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]
    if mode == "triton":
        return [*flags, "--trace-config", f"triton,file={directory}/trace.json"]
    return [*flags, "--trace-config", "mode=opentelemetry",
            "--trace-config", f"opentelemetry,url={OtlpSink.shared().url}"]


class OtlpSink:
    """An OTLP/HTTP endpoint that accepts every export and keeps nothing."""

    _shared: OtlpSink | None = None

    def __init__(self) -> None:
        class Accept(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Accept)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    @classmethod
    def shared(cls) -> OtlpSink:
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared


def measure(tree: Path, protocol: str, requests: int, trace: str | None = None,
            kind: str = "thread", flags: tuple[str, ...] = (),
            edit_config: Callable[[str], str] | None = None) -> int:
    """Instructions per request of the server from ``tree``'s sources (all its processes),
    started with ``flags`` more, identity's config.pbtxt passed through ``edit_config``."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        # identity alone: the other models' instances would only slow the start under valgrind.
        shutil.copytree(REPOSITORY / "identity", directory / "repository" / "identity")
        if edit_config is not None:
            config = directory / "repository" / "identity" / "config.pbtxt"
            config.write_text(edit_config(config.read_text()))
        server = TritiumProcess(directory / "repository", *trace_flags(trace, directory),
                                "--python-instance-kind", kind, *flags,
                                env={"PYTHONPATH": str(tree / "src")})
        server.args = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                       f"--callgrind-out-file={directory}/callgrind.%p", *server.args]
        server.start(timeout=600)
        try:
            def send(count: int) -> None:
                if protocol == "http":
                    send_http(server.http_port, count)
                else:
                    send_grpc(server.grpc_url, count)

            send(WARM_UP)
            below = descendants(server.pid)
            pids = [server.pid, *below]
            for action in ("--zero", "--dump"):
                for pid in pids:
                    subprocess.run(["callgrind_control", action, str(pid)], check=True,
                                   capture_output=True)
                if action == "--zero":
                    send(requests)
            if len(pids) > 1:  # where they went: the server, its guardians, their instances
                guardians = [p for p, parent in below.items() if parent == server.pid]
                roles = {"server": [server.pid], "guardians": guardians,
                         "instance processes": [p for p in pids[1:] if p not in guardians]}
                print("      " + ", ".join(
                    f"{role} {dumped_instructions(directory, members) // requests:,d}"
                    for role, members in roles.items()), flush=True)
            return dumped_instructions(directory, pids) // requests
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--protocols", nargs="+", choices=["http", "grpc"],
                        default=["http", "grpc"])
    parser.add_argument("--tree", type=Path, nargs="*", default=[],
                        help="other checkouts to measure besides this one")
    parser.add_argument("--trace", choices=["triton", "opentelemetry"], default=None,
                        help="trace every request in this mode")
    parser.add_argument("--kind", choices=["thread", "process"], default="thread",
                        help="the python instance kind (process: every process counted)")
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                        help="one more flag for the server, as --server-flag=--flag=value "
                             "(repeatable)")
    args = parser.parse_args()
    traced = f", traced: {args.trace}" if args.trace else ""
    flags = tuple(args.server_flag)
    served = f", {' '.join(flags)}" if flags else ""
    for protocol in args.protocols:
        for tree in [ROOT, *args.tree]:
            count = measure(tree.resolve(), protocol, args.requests, args.trace, args.kind,
                            flags)
            print(f"{protocol:4s}  {count:9,d} instructions/infer  ({args.kind} kind, "
                  f"{tree}{traced}{served})",
                  flush=True)


if __name__ == "__main__":
    main()
