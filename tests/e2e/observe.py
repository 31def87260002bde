"""Reading what test models recorded and what the server's metrics say, with bounded waits."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import requests


class Records:
    """The JSON lines a recording test model appends: {"event", "id", "t"}."""

    def __init__(self, path: Path):
        self.path = path

    def _rows(self, request_id: str) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        text = self.path.read_text()
        # A model may be appending a line right now: only whole lines are read.
        lines = text[:text.rfind("\n") + 1].splitlines()
        return [r for r in map(json.loads, lines) if r["id"] == request_id]

    def events(self, request_id: str) -> list[str]:
        return [str(r["event"]) for r in self._rows(request_id)]

    def times(self, request_id: str, event: str) -> list[float]:
        """When the model recorded ``event`` (CLOCK_MONOTONIC, shared by processes)."""
        return [float(r["t"]) for r in self._rows(request_id)  # type: ignore[arg-type]
                if r["event"] == event]

    def wait_for(self, request_id: str, event: str, timeout: float = 10.0) -> float:
        """Wait until the model recorded ``event``; returns when it did."""
        deadline = time.monotonic() + timeout
        while not (found := self.times(request_id, event)):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{event!r} never recorded for {request_id}: {self.events(request_id)}")
            time.sleep(0.005)
        return found[0]

    async def wait_for_async(self, request_id: str, event: str) -> float:
        return await asyncio.to_thread(self.wait_for, request_id, event)


def metric(metrics_url: str, name: str, **labels: str) -> float:
    """The value of one series on /metrics (0 if absent)."""
    text = requests.get(metrics_url, timeout=10).text
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for_metric(metrics_url: str, name: str, value: float, timeout: float = 10.0,
                    **labels: str) -> None:
    deadline = time.monotonic() + timeout
    while (current := metric(metrics_url, name, **labels)) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels} is {current}, expected {value}")
        time.sleep(0.01)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` (something another process changes) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
