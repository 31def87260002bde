"""The machine's CPU utilization and memory, as Triton's CPU metrics report them: read from
Linux's /proc at each metrics interval, served as three gauges without labels."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("tritium.metrics")

UTILIZATION = "nv_cpu_utilization"
MEMORY_TOTAL = "nv_cpu_memory_total_bytes"
MEMORY_USED = "nv_cpu_memory_used_bytes"
NAMES = (UTILIZATION, MEMORY_TOTAL, MEMORY_USED)

PROC_STAT = Path("/proc/stat")
PROC_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The aggregate "cpu" line of /proc/stat, in clock ticks, split as utilization needs."""

    busy: int  # user, nice, system, irq, softirq, steal
    idle: int  # idle, iowait


@dataclass(frozen=True, slots=True)
class HostReading:
    utilization: float  # 0.0 - 1.0 over the last interval
    memory_total: int  # bytes
    memory_used: int  # bytes: total less what is available to start new work


def parse_cpu_times(text: str) -> CpuTimes:
    """The first line of /proc/stat; ValueError when it is not the aggregate line."""
    fields = text.split("\n", 1)[0].split()
    if len(fields) < 9 or fields[0] != "cpu":
        raise ValueError("no aggregate cpu line in /proc/stat")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    # guest time is already inside user and nice: it is not added again.
    return CpuTimes(busy=user + nice + system + irq + softirq + steal, idle=idle + iowait)


def utilization(new: CpuTimes, old: CpuTimes) -> float:
    """Share of the time between two readings the CPUs spent busy; 0 when none passed."""
    # A counter that went backwards (a hot-unplugged CPU) counts as no time, never negative.
    busy = max(new.busy - old.busy, 0)
    idle = max(new.idle - old.idle, 0)
    return busy / (busy + idle) if busy + idle else 0.0


def parse_memory(text: str) -> tuple[int, int]:
    """(total, used) bytes from /proc/meminfo, used being MemTotal - MemAvailable (the
    measure Triton chose: page cache the kernel would give back is not "used")."""
    kilobytes: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            kilobytes[name] = int(rest.split()[0])
    total, available = kilobytes.get("MemTotal"), kilobytes.get("MemAvailable")
    if total is None or available is None or available > total:
        raise ValueError("no usable MemTotal and MemAvailable in /proc/meminfo")
    return total * 1024, (total - available) * 1024


class HostSampler:
    """Reads /proc once per ``poll``; the reading in between is the last one taken. All
    zero until the first poll, as Triton's gauges are before its first interval."""

    def __init__(self, stat: Path = PROC_STAT, meminfo: Path = PROC_MEMINFO):
        self._stat = stat
        self._meminfo = meminfo
        self._warned = False
        self._last_times = self._read_times()
        self.reading = HostReading(0.0, 0, 0)

    def poll(self) -> HostReading:
        times = self._read_times()
        busy = 0.0
        if times is not None and self._last_times is not None:
            busy = utilization(times, self._last_times)
        self._last_times = times or self._last_times
        try:
            total, used = parse_memory(self._meminfo.read_text())
        except (OSError, ValueError) as exc:
            self._warn(exc)
            total = used = 0
        self.reading = HostReading(busy, total, used)
        return self.reading

    def _read_times(self) -> CpuTimes | None:
        try:
            return parse_cpu_times(self._stat.read_text())
        except (OSError, ValueError) as exc:
            self._warn(exc)
            return None

    def _warn(self, exc: Exception) -> None:
        if not self._warned:  # once: the same failure would repeat at every interval
            self._warned = True
            log.warning("CPU metrics may not be available: %s", exc)


class HostCollector(Collector):
    """The last reading of ``sampler`` as Triton's three CPU gauges."""

    def __init__(self, sampler: HostSampler):
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        reading = self._sampler.reading
        yield _gauge(UTILIZATION, "CPU utilization rate [0.0 - 1.0]", reading.utilization)
        yield _gauge(MEMORY_TOTAL, "CPU total memory (RAM), in bytes", reading.memory_total)
        yield _gauge(MEMORY_USED, "CPU used memory (RAM), in bytes", reading.memory_used)


def _gauge(name: str, text: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, text)
    family.add_metric((), value)
    return family
