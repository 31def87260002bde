"""The live page's pieces without a server: history rates, remembered cancellations and
their stop delays, the page's state, and its restriction group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from tritium.core.restrictions import ApiGroup, parse_restriction
from tritium.core.statistics import RECENT_CANCELLATIONS, ModelStatistics
from tritium.metrics.history import History, Sample, rates
from tritium.metrics.live import LiveState, latest_cancellations, page


@dataclass
class FakeModel:
    name: str
    version: int = 1
    stats: ModelStatistics = field(default_factory=ModelStatistics)
    instances: list[Any] = field(default_factory=list)

    def statistics(self) -> ModelStatistics:
        return self.stats

    def in_flight(self) -> int:
        return 3


def test_rates_between_two_samples() -> None:
    older = Sample(wall=100.0, successes=10, success_ns=10_000_000, failures=1)
    newer = Sample(wall=102.0, successes=30, success_ns=50_000_000, failures=5)
    assert rates(older, newer) == {"t": 102.0, "rps": 10.0, "errors_ps": 2.0, "latency_ms": 2.0}
    idle = Sample(wall=104.0, successes=30, success_ns=50_000_000, failures=5)
    assert rates(newer, idle)["latency_ms"] == 0.0


def test_history_keeps_the_window_and_forgets_unloaded_versions() -> None:
    history = History(interval_s=1.0, window_s=3.0)
    model = FakeModel("m")
    for second in range(10):
        model.stats.success.add(1_000_000)
        history.sample([model], wall=float(second))
    series = history.series("m", 1)
    assert [point["t"] for point in series] == [7.0, 8.0, 9.0]  # 4 samples kept: 3 rates
    assert all(point["rps"] == 1.0 and point["latency_ms"] == 1.0 for point in series)
    history.sample([], wall=10.0)
    assert history.series("m", 1) == []


def test_a_stop_fills_the_record_of_its_cancellation() -> None:
    stats = ModelStatistics()
    stats.record_cancel("a", "CLIENT_CANCELLED", "executing", cancelled_at_ns=111)
    stats.record_cancel("b", "DEADLINE", "executing", cancelled_at_ns=222)
    stats.record_cancel_stop(3_500_000, cancelled_at_ns=111)
    first, second = stats.recent_cancellations
    assert (first.request_id, first.stop_ms) == ("a", 3.5)
    assert second.stop_ms is None
    assert stats.cancellations[("DEADLINE", "executing")] == 1
    assert stats.cancel_stop.count == 1


def test_requests_sharing_a_cancellation_take_its_records_in_turn() -> None:
    stats = ModelStatistics()
    stats.record_cancel("child-1", "PARENT_CANCELLED", "executing", cancelled_at_ns=7)
    stats.record_cancel("child-2", "PARENT_CANCELLED", "executing", cancelled_at_ns=7)
    stats.record_cancel_stop(1_000_000, cancelled_at_ns=7)
    stats.record_cancel_stop(2_000_000, cancelled_at_ns=7)
    assert sorted(r.stop_ms or 0 for r in stats.recent_cancellations) == [1.0, 2.0]


def test_only_the_latest_cancellations_are_remembered() -> None:
    stats = ModelStatistics()
    for index in range(RECENT_CANCELLATIONS + 5):
        stats.record_cancel(f"r{index}", "CLIENT_DISCONNECTED", "queued", index + 1)
    assert len(stats.recent_cancellations) == RECENT_CANCELLATIONS
    assert stats.recent_cancellations[0].request_id == "r5"
    assert sum(stats.cancellations.values()) == RECENT_CANCELLATIONS + 5


def test_latest_cancellations_merge_models_newest_first() -> None:
    one, two = FakeModel("one"), FakeModel("two")
    for model, request_id, wall in ((one, "old", 1.0), (two, "new", 3.0), (one, "mid", 2.0)):
        model.stats.record_cancel(request_id, "SHUTDOWN", "executing", 5)
        model.stats.recent_cancellations[-1].wall_time = wall
    rows = latest_cancellations([one, two], limit=2)
    assert [(r["model"], r["request_id"]) for r in rows] == [("two", "new"), ("one", "mid")]


@dataclass
class Entry:
    name: str
    version: int | None
    state: Any
    reason: str = ""


class State:
    def __init__(self, value: str):
        self.value = value


class Catalog:
    def __init__(self, models: list[FakeModel]):
        self.models = models

    def loaded_models(self) -> list[FakeModel]:
        return self.models

    def index(self, ready_only: bool) -> list[Entry]:
        rows = [Entry(m.name, m.version, State("READY")) for m in self.models]
        return [*rows, Entry("broken", None, State("UNAVAILABLE"), "bad config")]


@dataclass
class Instance:
    name: str
    kind: str = "thread"
    restarts: int = 0
    ready: bool = True


def test_state_lists_every_model_with_its_figures() -> None:
    model = FakeModel("m", instances=[Instance("m_0"), Instance("m_1", "process", restarts=2,
                                                                ready=False)])
    model.stats.pending, model.stats.executing = 4, 1
    model.stats.failures["CANCELED"] += 2
    state = orjson.loads(LiveState(Catalog([model]), History(1.0), None, 1.0).render())
    row, broken = state["models"]
    assert (row["pending"], row["executing"], row["in_flight"]) == (4, 1, 3)
    assert row["failures"] == {"CANCELED": 2}
    assert row["instances"] == [
        {"name": "m_0", "kind": "thread", "state": "ready", "restarts": 0},
        {"name": "m_1", "kind": "process", "state": "restarting", "restarts": 2}]
    assert broken == {"name": "broken", "version": None, "state": "UNAVAILABLE",
                      "reason": "bad config"}
    assert state["host"] is None and state["interval_ms"] == 1000


def test_the_page_ships_in_the_package_and_loads_nothing_else() -> None:
    html = page().decode()
    assert html.startswith("<!DOCTYPE html>") and "live/state" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "innerHTML" not in html  # request ids come from clients: text only


def test_live_is_a_group_of_the_http_restriction_flag_only() -> None:
    (restriction,) = parse_restriction("live:k=v")
    assert restriction.group is ApiGroup.LIVE
    assert restriction.allows({"k": "v"}) and not restriction.allows({})
    with pytest.raises(ValueError, match=r"unknown restricted protocol 'live' \(allowed: .*"
                                         r"logging\)"):
        parse_restriction("live:k=v", "protocol")


@pytest.mark.parametrize("interval_s", [0.1, 2.0, 60.0])
def test_history_holds_at_least_two_samples(interval_s: float) -> None:
    history = History(interval_s)
    model = FakeModel("m")
    history.sample([model], wall=0.0)
    history.sample([model], wall=interval_s)
    assert len(history.series("m", 1)) == 1
