"""Families of text generation (OpenAI API) requests, beside Triton's: requests by endpoint
and outcome, prompt and generated tokens, and the two latency histograms LLM dashboards
plot (time to first token, inter-token latency), per model version."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from tritium.core.llm_statistics import OUTCOMES, GenerationSnapshot, Histogram
from tritium.metrics.labels import label_names, label_values

REQUESTS = "tritium_openai_request"
PROMPT_TOKENS = "tritium_openai_prompt_tokens"
GENERATION_TOKENS = "tritium_openai_generation_tokens"
TIME_TO_FIRST_TOKEN = "tritium_openai_time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "tritium_openai_inter_token_latency_seconds"
NAMES = (REQUESTS, PROMPT_TOKENS, GENERATION_TOKENS, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY)
ENDPOINTS = ("completions", "chat_completions")

Labels = Mapping[str, str]


def _counter(name: str, text: str) -> Metric:
    return Metric(name, text, "counter")  # no "_total", like Triton's counters


def generation_families(models: Sequence[tuple[Any, Any, Labels]]) -> Iterator[Metric]:
    """``models``: (model, its ModelStatistics, its labels), as the Triton collector has them."""
    snapshots = [(stats.generation.snapshot(), labels) for _, stats, labels in models]
    yield _requests(snapshots)
    yield _tokens(PROMPT_TOKENS, "Prompt tokens of OpenAI API requests, as the model reported "
                  "them (num_input_tokens)", snapshots, lambda s: s.prompt_tokens)
    yield _tokens(GENERATION_TOKENS, "Tokens generated for OpenAI API requests: the model's "
                  "num_output_tokens, or its responses with text where it reports none",
                  snapshots, lambda s: s.generation_tokens)
    yield _histogram(TIME_TO_FIRST_TOKEN, "Time from an OpenAI API request's admission to "
                     "the model's first response with text, in seconds", snapshots,
                     lambda s: s.time_to_first_token)
    yield _histogram(INTER_TOKEN_LATENCY, "Time between successive responses with text of "
                     "one OpenAI API request, in seconds", snapshots,
                     lambda s: s.inter_token_latency)


def _requests(snapshots: list[tuple[GenerationSnapshot, Labels]]) -> Metric:
    family = _counter(REQUESTS, "OpenAI API requests by endpoint and outcome (success, error, "
                                "or cancelled: the client left)")
    for snapshot, labels in snapshots:
        for endpoint in ENDPOINTS:
            for outcome in OUTCOMES:
                family.add_sample(REQUESTS, dict(sorted(
                    {**labels, "endpoint": endpoint, "outcome": outcome}.items())),
                    snapshot.requests.get((endpoint, outcome), 0))
    return family


def _tokens(name: str, text: str, snapshots: list[tuple[GenerationSnapshot, Labels]],
            read: Any) -> Metric:
    family = _counter(name, text)
    for snapshot, labels in snapshots:
        family.add_sample(name, dict(labels), read(snapshot))
    return family


def _histogram(name: str, text: str, snapshots: list[tuple[GenerationSnapshot, Labels]],
               read: Any) -> Metric:
    names = label_names(snapshots)
    family = HistogramMetricFamily(name, text, labels=names)
    for snapshot, labels in snapshots:
        histogram: Histogram = read(snapshot)
        buckets = [("+Inf" if bound == float("inf") else str(bound), count)
                   for bound, count in histogram.cumulative()]
        family.add_metric(label_values(labels, names), buckets, histogram.total)
    return family
