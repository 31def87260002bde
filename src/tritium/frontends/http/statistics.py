"""Model statistics in the JSON shape of Triton's statistics extension."""

from __future__ import annotations

from typing import Any

from tritium.core.service import ModelStatisticsEntry
from tritium.core.statistics import Duration, ModelStatistics


def _duration(value: Duration) -> dict[str, int]:
    return {"count": value.count, "ns": value.ns}


def _model(entry: ModelStatisticsEntry) -> dict[str, Any]:
    stats: ModelStatistics = entry.stats
    return {
        "name": entry.name,
        "version": str(entry.version),
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            "queue": _duration(stats.queue),
            "compute_input": _duration(stats.compute_input),
            "compute_infer": _duration(stats.compute_infer),
            "compute_output": _duration(stats.compute_output),
            "cache_hit": _duration(stats.cache_hit),
            "cache_miss": _duration(stats.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [
            {"batch_size": size, "compute_input": _duration(Duration(timing.count)),
             "compute_infer": _duration(timing),
             "compute_output": _duration(Duration(timing.count))}
            for size, timing in sorted(dict(stats.batches).items())
        ],
        "memory_usage": [],
    }


def encode_statistics(entries: list[ModelStatisticsEntry]) -> dict[str, Any]:
    return {"model_stats": [_model(entry) for entry in entries]}
