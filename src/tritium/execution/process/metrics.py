"""Custom metrics of a model in an instance process, kept in the server's registry.

Families and series live in the parent, in the registry /metrics reads, so instances of
one model (each its own process) share a series as thread instances do, and a series'
value is the server's. The child checks arguments itself (the same code as the thread
kind) and sends the operations. Creating a family or a series and reading a value wait for
the server; an update does not (nothing is left to refuse once the child checked it), and
the server runs calls in the order they were sent, so ``value()`` reads what was written
before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritium.backends.python import metric
from tritium.backends.python.metric import FamilySnapshot, MetricFamily, MetricKind, SeriesSnapshot
from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.process.codec import convert

if TYPE_CHECKING:
    from tritium.execution.process.calls import Call, CallContext, ChildLink, Handler

FAMILY = "metric.family"
SERIES = "metric.series"
UPDATE = "metric.update"
SNAPSHOT = "metric.snapshot"

LabelKey = tuple[tuple[str, str], ...]


# -- in the server -------------------------------------------------------------------


def _registered(name: str) -> metric.RegisteredFamily:
    with MetricFamily._registry_lock:
        family = MetricFamily._registry.get(name)
    if family is None:
        raise TritiumError(ErrorCode.INTERNAL, f"no metric family named '{name}'")
    return family


async def serve_family(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, description, kind = convert(tuple[str, str, int], payload)
    family = MetricFamily.register_here(name, description, MetricKind(kind))
    ctx.reply((int(family.kind), family.description), final=True)


async def serve_series(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, labels, bounds = convert(tuple[str, LabelKey, tuple[float, ...]], payload)
    _registered(name).get_series(dict(labels), tuple(bounds))
    ctx.reply(None, final=True)


async def serve_update(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, key, operation, value = convert(tuple[str, LabelKey, str, float], payload)
    series = _series(name, key)
    if operation == "add":
        series.add(value)
    elif operation == "set":
        series.set(value)
    elif operation == "observe":
        series.observe(value)
    ctx.reply(series.get() if operation == "get" else None, final=True)


async def serve_snapshot(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, key = convert(tuple[str, LabelKey | None], payload)
    if key is None:
        ctx.reply(_registered(name).snapshot(), final=True)
    else:
        ctx.reply(_series(name, key).snapshot(), final=True)


def _series(name: str, key: LabelKey) -> Any:
    series = _registered(name).series.get(key)
    if series is None:
        raise TritiumError(ErrorCode.INTERNAL, f"metric family '{name}' has no such series")
    return series


HANDLERS: dict[str, Handler] = {
    FAMILY: serve_family, SERIES: serve_series, UPDATE: serve_update, SNAPSHOT: serve_snapshot,
}


# -- in the instance process -----------------------------------------------------------


class RemoteSeries:
    """A series of the server's registry, named by its family and labels."""

    def __init__(self, link: ChildLink, family: str, kind: MetricKind, labels: dict[str, str]):
        self.kind = kind
        self.labels = labels
        self._link = link
        self._name = family
        self._key: LabelKey = tuple(sorted(labels.items()))

    def _update(self, operation: str, value: float = 0.0) -> Call:
        return self._link.call(UPDATE, (self._name, self._key, operation, value))

    def add(self, value: float) -> None:
        self._update("add", value)

    def set(self, value: float) -> None:
        self._update("set", value)

    def get(self) -> float:
        return float(self._update("get").result()[0])

    def observe(self, value: float) -> None:
        self._update("observe", value)

    def snapshot(self) -> SeriesSnapshot:
        reply = self._link.call(SNAPSHOT, (self._name, self._key)).result()[0]
        snapshot: SeriesSnapshot = convert(SeriesSnapshot, reply)
        return snapshot


class RemoteFamily:
    def __init__(self, link: ChildLink, name: str, description: str, kind: MetricKind):
        self.name, self.description, self.kind = name, description, kind
        self._link = link

    def get_series(self, labels: dict[str, str], bounds: tuple[float, ...]) -> RemoteSeries:
        self._link.call(SERIES, (self.name, sorted(labels.items()), list(bounds))).result()
        return RemoteSeries(self._link, self.name, self.kind, labels)

    def snapshot(self) -> FamilySnapshot:
        reply = self._link.call(SNAPSHOT, (self.name, None)).result()[0]
        snapshot: FamilySnapshot = convert(FamilySnapshot, reply)
        return snapshot


class RemoteFamilies:
    def __init__(self, link: ChildLink):
        self._link = link

    def family(self, name: str, description: str, kind: MetricKind) -> RemoteFamily:
        registered, text = self._link.call(FAMILY, (name, description, int(kind))).result()[0]
        return RemoteFamily(self._link, name, text, MetricKind(registered))

