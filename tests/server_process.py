"""Starts a real ``tritium serve`` process on free loopback ports and reads its log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ENDPOINT = re.compile(r"(HTTP|gRPC|metrics) endpoint listening on [^:]+:(\d+)")


class TritiumProcess:
    def __init__(self, repository: Path, *extra_args: str, env: dict[str, str] | None = None):
        self.repository = repository
        self.args = [
            sys.executable, "-m", "tritium", "serve",
            "--model-repository", str(repository),
            "--http-address", "127.0.0.1", "--http-port", "0",
            "--grpc-address", "127.0.0.1", "--grpc-port", "0",
            "--metrics-address", "127.0.0.1", "--metrics-port", "0",
            # Tests stop their servers with SIGTERM: no lame duck unless a test asks for one.
            "--lame-duck-secs", "0",
            *extra_args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._changed = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> TritiumProcess:
        self.proc = subprocess.Popen(
            self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=self.env
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for_line("server ready", timeout)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                found = ENDPOINT.search(line)
                if found:
                    self.ports[found.group(1)] = int(found.group(2))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, text: str, timeout: float = 10.0, start: int = 0) -> str:
        """The first log line (from index ``start``) containing ``text``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[start:]:
                    if text in line:
                        return line
                if self.proc is not None and self.proc.poll() is not None and not self._alive():
                    raise AssertionError(f"server exited; log:\n{self.log()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no log line with {text!r}; log:\n{self.log()}")
                self._changed.wait(remaining)

    def _alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.stderr is not None and not proc.stderr.closed

    def log(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code (killed if it outlives ``timeout``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    # -- addresses ---------------------------------------------------------------
    @property
    def http_port(self) -> int:
        return self.ports["HTTP"]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['HTTP']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['gRPC']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"
