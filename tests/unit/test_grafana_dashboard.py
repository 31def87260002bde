"""The Grafana dashboard in deploy/ queries only what tritium exports, and shows all of it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tritium.core.statistics import ModelStatistics
from tritium.metrics.server import MetricsServer, render

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "tritium.json"
METRIC = re.compile(r"\b(?:nv|tritium)_\w+")
BY = re.compile(r"\bby \(([^)]*)\)")


class Model:
    name, version, load_seconds = "m", 1, 0.5

    def __init__(self) -> None:
        self.stats = ModelStatistics()

    def statistics(self) -> ModelStatistics:
        return self.stats

    def instance_restarts(self) -> dict[str, int]:
        return {"m_0": 1}


def exposition() -> dict[str, set[str]]:
    """Every sample name tritium's /metrics writes, with the label names it carries."""
    server = MetricsServer(lambda: [Model()])
    samples: dict[str, set[str]] = {}
    for line in render(server.registry).decode().splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, labels = line.split(" ")[0].partition("{")
        samples.setdefault(name, set()).update(re.findall(r'(\w+)="', labels))
    return samples


def panels(node: Any) -> Iterator[dict[str, Any]]:
    for panel in node.get("panels", []):
        yield panel
        yield from panels(panel)


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in panels(dashboard) for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return exposition()


def test_every_queried_metric_is_exported(exported: dict[str, set[str]]) -> None:
    queried = {name for expr in expressions() for name in METRIC.findall(expr)}
    assert queried, "the dashboard queries nothing"
    assert queried - set(exported) == set()


def test_every_grouping_label_is_on_the_metrics_grouped(exported: dict[str, set[str]]) -> None:
    for expr in expressions():
        labels = set().union(*(exported[name] for name in METRIC.findall(expr)))
        for group in BY.findall(expr):
            wanted = {label.strip() for label in group.split(",")} - {"le"}
            assert wanted <= labels, (expr, wanted - labels)


def test_every_exported_family_is_on_the_dashboard(exported: dict[str, set[str]]) -> None:
    shown = {name for expr in expressions() for name in METRIC.findall(expr)}
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in exported}
    shown_families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in shown}
    assert families - shown_families == set()


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "model"}
    for panel in panels(dashboard):
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].count("(") == target["expr"].count(")")
