"""The live page's state: models and their instances, queue and in-flight counts, the last
minutes of throughput and latency, and the latest cancellations, as one small JSON object
the page polls. Read on the event loop, where the statistics are written."""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any, Protocol

import orjson

from tritium.metrics.history import History
from tritium.metrics.host import HostSampler

PAGE_PATH = "/live"
STATE_PATH = "/live/state"
# The page's whole list; each model remembers up to RECENT_CANCELLATIONS of its own.
LATEST_CANCELLATIONS = 50


@functools.cache
def page() -> bytes:
    """The page: one HTML file with its styles and script inside, shipped in the package."""
    return resources.files("tritium.metrics").joinpath("live.html").read_bytes()


class Catalog(Protocol):
    """What the page needs of the model manager."""

    def loaded_models(self) -> list[Any]: ...

    def index(self, ready_only: bool) -> list[Any]: ...


class LiveState:
    def __init__(self, catalog: Catalog, history: History, host: HostSampler | None,
                 interval_s: float):
        self._catalog = catalog
        self._history = history
        self._host = host
        self._interval_s = interval_s

    def render(self) -> bytes:
        loaded = {(m.name, m.version): m for m in self._catalog.loaded_models()}
        models = [self._model(entry, loaded.get((entry.name, entry.version)))
                  for entry in self._catalog.index(ready_only=False)]
        state = {
            "time": time.time(),
            "interval_ms": round(self._interval_s * 1000),
            "window_s": self._history.window_s,
            "host": self._host_figures(),
            "models": models,
            "cancellations": latest_cancellations(loaded.values()),
        }
        return orjson.dumps(state)

    def _model(self, entry: Any, model: Any | None) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": entry.name,
            "version": entry.version,
            "state": entry.state.value,
            "reason": entry.reason or "",
        }
        if model is None:
            return row
        stats = model.statistics()
        in_flight = getattr(model, "in_flight", None)
        row.update(
            pending=max(stats.pending, 0),
            executing=max(stats.executing, 0),
            in_flight=in_flight() if in_flight is not None else stats.executing,
            success=stats.success.count,
            failures=dict(stats.failures),
            instances=list(_instances(model)),
            series=self._history.series(model.name, model.version),
        )
        return row

    def _host_figures(self) -> dict[str, float] | None:
        if self._host is None:
            return None
        reading = self._host.reading
        return {"cpu_utilization": reading.utilization, "memory_used": reading.memory_used,
                "memory_total": reading.memory_total}


def _instances(model: Any) -> Iterator[dict[str, Any]]:
    for instance in getattr(model, "instances", ()):  # an ensemble has none of its own
        yield {
            "name": instance.name,
            "kind": instance.kind,
            "state": "ready" if instance.ready else "restarting",
            "restarts": instance.restarts,
        }


def latest_cancellations(models: Iterable[Any],
                         limit: int = LATEST_CANCELLATIONS) -> list[dict[str, Any]]:
    """Every model's recent cancellations, newest first."""
    rows = [(record, model) for model in models
            for record in model.statistics().recent_cancellations]
    newest = heapq.nlargest(limit, rows, key=lambda pair: pair[0].wall_time)
    return [{
        "time": record.wall_time,
        "model": model.name,
        "version": model.version,
        "request_id": record.request_id,
        "reason": record.reason,
        "stage": record.stage,
        "stop_ms": record.stop_ms,
    } for record, model in newest]
