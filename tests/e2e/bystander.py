"""An unrelated client that keeps asking a server something cheap while an attack runs, so a
test can say how long the attack kept everyone else waiting, against a baseline taken in the
same test (other processes share the machine's cores)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

# Served within this long of the baseline's worst, attack or not.
PROMPT_S = 0.1
_PAUSE_S = 0.02


class Bystander:
    """Probes ``url`` with GET every few milliseconds on its own connection."""

    def __init__(self, url: str, verify: str | bool = True):
        self.url = url
        self.verify = verify  # per request: an environment's CA bundle beats a session's
        self.session = requests.Session()
        self.baseline = self._worst(self._probe() for _ in range(20))

    def _probe(self) -> float:
        started = time.monotonic()
        reply = self.session.get(self.url, timeout=60, verify=self.verify)
        assert reply.status_code == 200, reply.text
        return time.monotonic() - started

    @staticmethod
    def _worst(samples: Iterator[float]) -> float:
        values = list(samples)
        return max(values)

    @contextmanager
    def watching(self) -> Iterator[list[float]]:
        """Probe in the background for the duration of the block; yields the latencies."""
        latencies: list[float] = []
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                latencies.append(self._probe())
                stop.wait(_PAUSE_S)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield latencies
        finally:
            stop.set()
            thread.join(120)
        latencies.append(self._probe())

    def assert_served(self, latencies: list[float]) -> None:
        worst = max(latencies)
        allowed = PROMPT_S + 2 * self.baseline
        assert worst < allowed, (f"an unrelated client waited {worst * 1000:.0f} ms "
                                 f"(baseline {self.baseline * 1000:.0f} ms)")

    def close(self) -> None:
        self.session.close()


def health_url(http_url: str) -> str:
    """The liveness route of a server whose ``http_url`` is ``host:port``."""
    return f"http://{http_url}/v2/health/live"


def peak_rss_bytes(pid: int) -> int:
    """The most memory process ``pid`` has held resident so far (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
