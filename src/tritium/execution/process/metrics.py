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
from tritium.execution.process.messages import (
    FamilyCall,
    FamilyRegistered,
    MetricUpdate,
    SeriesCall,
    SnapshotCall,
)

if TYPE_CHECKING:
    from tritium.execution.process.calls import Call, CallContext, ChildLink, Handler

FAMILY = "metric.family"
SERIES = "metric.series"
UPDATE = "metric.update"
SNAPSHOT = "metric.snapshot"

# -- in the server -------------------------------------------------------------------


def _registered(name: str) -> metric.RegisteredFamily:
    with MetricFamily._registry_lock:
        family = MetricFamily._registry.get(name)
    if family is None:
        raise TritiumError(ErrorCode.INTERNAL, f"no metric family named '{name}'")
    return family


async def serve_family(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: FamilyCall = convert(FamilyCall, payload)
    family = MetricFamily.register_here(sent.name, sent.description, MetricKind(sent.kind))
    ctx.reply(FamilyRegistered(int(family.kind), family.description), final=True)


async def serve_series(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: SeriesCall = convert(SeriesCall, payload)
    _registered(sent.family).get_series(sent.labels, tuple(sent.bounds))
    ctx.reply(None, final=True)


async def serve_update(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: MetricUpdate = convert(MetricUpdate, payload)
    series = _series(sent.family, sent.labels)
    if sent.operation == "add":
        series.add(sent.value)
    elif sent.operation == "set":
        series.set(sent.value)
    elif sent.operation == "observe":
        series.observe(sent.value)
    ctx.reply(series.get() if sent.operation == "get" else None, final=True)


async def serve_snapshot(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: SnapshotCall = convert(SnapshotCall, payload)
    if sent.labels is None:
        ctx.reply(_registered(sent.family).snapshot(), final=True)
    else:
        ctx.reply(_series(sent.family, sent.labels).snapshot(), final=True)


def _series(name: str, labels: dict[str, str]) -> Any:
    series = _registered(name).series.get(tuple(sorted(labels.items())))
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

    def _update(self, operation: str, value: float = 0.0) -> Call:
        return self._link.call(UPDATE, MetricUpdate(self._name, self.labels, operation, value))

    def add(self, value: float) -> None:
        self._update("add", value)

    def set(self, value: float) -> None:
        self._update("set", value)

    def get(self) -> float:
        value: float = convert(float, self._update("get").result().payload)
        return value

    def observe(self, value: float) -> None:
        self._update("observe", value)

    def snapshot(self) -> SeriesSnapshot:
        reply = self._link.call(SNAPSHOT, SnapshotCall(self._name, self.labels)).result().payload
        snapshot: SeriesSnapshot = convert(SeriesSnapshot, reply)
        return snapshot


class RemoteFamily:
    def __init__(self, link: ChildLink, name: str, description: str, kind: MetricKind):
        self.name, self.description, self.kind = name, description, kind
        self._link = link

    def get_series(self, labels: dict[str, str], bounds: tuple[float, ...]) -> RemoteSeries:
        self._link.call(SERIES, SeriesCall(self.name, labels, list(bounds))).result()
        return RemoteSeries(self._link, self.name, self.kind, labels)

    def snapshot(self) -> FamilySnapshot:
        reply = self._link.call(SNAPSHOT, SnapshotCall(self.name, None)).result().payload
        snapshot: FamilySnapshot = convert(FamilySnapshot, reply)
        return snapshot


class RemoteFamilies:
    def __init__(self, link: ChildLink):
        self._link = link

    def family(self, name: str, description: str, kind: MetricKind) -> RemoteFamily:
        reply = self._link.call(FAMILY, FamilyCall(name, description, int(kind))).result()
        registered: FamilyRegistered = convert(FamilyRegistered, reply.payload)
        return RemoteFamily(self._link, name, registered.description,
                            MetricKind(registered.kind))

