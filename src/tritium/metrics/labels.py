"""The labels of a model version's series, shared by the collector's families, and how a
number is written in a label (a bucket's ``le``, a quantile) or as a value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def model_labels(model: Any) -> dict[str, str]:
    """A model version's labels; ``namespace`` (its repository) too where the server runs
    with --model-namespacing, as Triton labels it."""
    labels = {"model": model.name, "version": str(model.version)}
    namespace = getattr(model, "namespace", "")
    if namespace:
        labels["namespace"] = namespace
    return labels


def label_names(models: Sequence[tuple[Any, ...]]) -> tuple[str, ...]:
    """The model label names of a family of ``models`` (each ending with its labels)."""
    if any("namespace" in entry[-1] for entry in models):
        return ("model", "namespace", "version")
    return ("model", "version")


def label_values(labels: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in names)


def format_value(value: float) -> str:
    """A double as prometheus-cpp writes it (an ostream at precision 16)."""
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"
