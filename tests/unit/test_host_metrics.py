"""CPU utilization and memory from /proc text, and the three gauges Triton names them by."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tritium.cli import parse_config
from tritium.metrics.host import (
    CpuTimes,
    HostCollector,
    HostSampler,
    parse_cpu_times,
    parse_memory,
    utilization,
)

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"
MEMINFO = "MemTotal:       2000 kB\nMemFree:         100 kB\nMemAvailable:    500 kB\n"


def stat(user: int = 0, system: int = 0, idle: int = 0, iowait: int = 0) -> str:
    return STAT.format(user=user, system=system, idle=idle, iowait=iowait)


def test_busy_and_idle_ticks_come_from_the_aggregate_line() -> None:
    assert parse_cpu_times("cpu  1 2 3 4 5 6 7 8 9 10\n") == CpuTimes(busy=1 + 2 + 3 + 6 + 7 + 8,
                                                                   idle=4 + 5)


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n",
                                  "cpu a b c d e f g h\n"])
def test_a_stat_without_an_aggregate_line_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_times(text)


def test_utilization_is_the_busy_share_between_readings() -> None:
    assert utilization(CpuTimes(130, 170), CpuTimes(100, 100)) == pytest.approx(0.3)
    assert utilization(CpuTimes(100, 100), CpuTimes(100, 100)) == 0.0
    # A counter that went backwards counts as no time, never as negative.
    assert utilization(CpuTimes(90, 110), CpuTimes(100, 100)) == 0.0


def test_used_memory_is_total_less_available() -> None:
    assert parse_memory(MEMINFO) == (2000 * 1024, 1500 * 1024)


@pytest.mark.parametrize("text", ["MemTotal: 2000 kB\n", "MemAvailable: 5 kB\n",
                                  "MemTotal: 10 kB\nMemAvailable: 20 kB\n"])
def test_memory_without_usable_figures_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_memory(text)


def test_sampler_reads_each_poll_and_keeps_the_last_reading(tmp_path: Path) -> None:
    stat_file, meminfo_file = tmp_path / "stat", tmp_path / "meminfo"
    stat_file.write_text(stat(user=100, idle=100))
    meminfo_file.write_text(MEMINFO)
    sampler = HostSampler(stat_file, meminfo_file)
    assert sampler.reading.memory_total == 0  # nothing read before the first interval
    stat_file.write_text(stat(user=175, idle=125))
    reading = sampler.poll()
    assert reading.utilization == pytest.approx(0.75)
    assert (reading.memory_total, reading.memory_used) == (2000 * 1024, 1500 * 1024)
    assert sampler.reading is reading


def test_unreadable_files_give_zeros_not_errors(tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path / "missing", tmp_path / "missing")
    reading = sampler.poll()
    assert (reading.utilization, reading.memory_total, reading.memory_used) == (0.0, 0, 0)


def test_gauges_have_tritons_names_and_no_labels(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text(stat(user=1, idle=1))
    (tmp_path / "meminfo").write_text(MEMINFO)
    sampler = HostSampler(tmp_path / "stat", tmp_path / "meminfo")
    sampler.poll()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(sampler))
    text = generate_latest(registry).decode()
    assert "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n" in text
    assert "# TYPE nv_cpu_memory_total_bytes gauge\n" in text
    assert "\nnv_cpu_memory_used_bytes 1.536e+06\n" in text
    assert "\nnv_cpu_utilization 0.0\n" in text


def test_flags_turn_cpu_metrics_off_and_set_the_interval() -> None:
    default = parse_config(["serve"])
    assert (default.allow_cpu_metrics, default.metrics_interval_ms) == (True, 2000)
    config = parse_config(["serve", "--allow-cpu-metrics", "false", "--metrics-interval-ms", "250"])
    assert (config.allow_cpu_metrics, config.metrics_interval_ms) == (False, 250)


@pytest.mark.parametrize("interval", ["0", "-5", "soon"])
def test_an_interval_must_be_a_positive_number(interval: str) -> None:
    with pytest.raises(SystemExit):
        parse_config(["serve", "--metrics-interval-ms", interval])
