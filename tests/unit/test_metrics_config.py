"""--metrics-config as tritonserver reads it: the latency switches, the summary quantiles,
and what it ignores (warned here) or cannot take (exit code 2)."""

from __future__ import annotations

import pytest

from tritium.cli import parse
from tritium.feature_config import DEFAULT_QUANTILES, LatencyMetrics


def latency(*settings: str) -> tuple[LatencyMetrics, list[str]]:
    config, warnings = parse([f"--metrics-config={s}" for s in settings], "tritonserver")
    return config.features.metrics.latency, warnings


def test_defaults_are_tritons() -> None:
    found, warnings = latency()
    assert found == LatencyMetrics(counters=True, summaries=False,
                                   quantiles=DEFAULT_QUANTILES, histograms=False)
    assert DEFAULT_QUANTILES[0] == (0.5, 0.05) and len(DEFAULT_QUANTILES) == 5
    assert not warnings


def test_the_switches() -> None:
    found, warnings = latency("counter_latencies=false", "summary_latencies=true",
                              "histogram_latencies=true",
                              "summary_quantiles=0.25:0.01,0.75:0.002")
    assert (found.counters, found.summaries, found.histograms) == (False, True, True)
    assert found.quantiles == ((0.25, 0.01), (0.75, 0.002))
    assert not warnings


def test_only_the_words_tritonserver_reads_switch() -> None:
    # tritonserver turns counters off only on "false", summaries on only on "true".
    found, warnings = latency("counter_latencies=False", "summary_latencies=1")
    assert found.counters is True and found.summaries is False
    assert len(warnings) == 1
    assert "counter_latencies=False (expected true or false)" in warnings[0]
    assert "summary_latencies=1" in warnings[0]


def test_unknown_settings_are_warned_about_and_ignored() -> None:
    found, warnings = latency("summary_latency=true")
    assert found == LatencyMetrics()
    assert warnings == ["--metrics-config settings ignored, as tritonserver ignores them: "
                        "summary_latency=true (not a metrics setting: counter_latencies, "
                        "summary_latencies, summary_quantiles, histogram_latencies)"]


def test_a_quantile_pair_that_does_not_parse_is_skipped() -> None:
    found, warnings = latency("summary_quantiles=0.5:0.05,0.9,0.99:x")
    assert found.quantiles == ((0.5, 0.05),)
    assert "Invalid option: [0.9]. No ':' delimiter found" in warnings[0]
    assert "Invalid option: [0.99:x]" in warnings[0]
    # Nothing usable: the default quantiles stay.
    assert latency("summary_quantiles=nonsense")[0].quantiles == DEFAULT_QUANTILES


@pytest.mark.parametrize("value", ["summary_quantiles=1.5:0.01", "summary_quantiles=0.5:-1",
                                   "counter_latencies", "=true", "counter_latencies=",
                                   "a,b=c"])
def test_values_it_cannot_take_exit_2_with_one_line(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse([f"--metrics-config={value}"], "tritonserver")
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--metrics-config" in error
    if "=" not in value or value.startswith("=") or value.endswith("=") or "," in value:
        assert f"option format is <setting>=<value>. Got {value}" in error
