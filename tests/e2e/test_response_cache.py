"""The response cache (--cache-config local,size=N and response_cache { enable: true }):
a repeated request is answered without running its model, over HTTP and gRPC, with
Triton's statistics and metrics; ensembles cache at the top level and per step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import instance_kinds
from tests.e2e.ensemble_zoo import add_ensemble
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

CACHE = "response_cache { enable: true }\n"
IO = _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
ENSEMBLE_IO = _tensor("input", "IN", "FP32", "-1") + _tensor("output", "OUT", "FP32", "-1")
# Room for two responses of BIG floats (plus their keys), not three.
BIG = 200
CACHE_BYTES = 2000


def _probe(repo: Path, name: str, records: Path, config: str) -> None:
    add_model(repo, name, "execute_probe",
              config + IO + _parameter("record_file", f"{records}/{name}.jsonl"))


@pytest.fixture(scope="module", params=instance_kinds())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("cache")
    records = tmp_path_factory.mktemp("cache-records")
    _probe(repo, "cached", records, CACHE)
    _probe(repo, "uncached", records, "")
    _probe(repo, "step", records, "")
    _probe(repo, "cached_decoupled", records, CACHE + DECOUPLED)
    step = [("step", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]
    ensemble_dir = add_ensemble(repo, "cached_ensemble", ENSEMBLE_IO, step)
    with (ensemble_dir / "config.pbtxt").open("a") as config:
        config.write(CACHE)
    add_ensemble(repo, "ensemble_of_cached", ENSEMBLE_IO,
                 [("cached", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    _probe(repo, "decoupled_step", records, DECOUPLED)
    streaming_dir = add_ensemble(repo, "cached_streaming_ensemble", ENSEMBLE_IO,
                                 [("decoupled_step", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    with (streaming_dir / "config.pbtxt").open("a") as config:
        config.write(CACHE)
    process = TritiumProcess(repo, "--python-instance-kind", request.param,
                             "--cache-config", f"local,size={CACHE_BYTES}",
                             "--model-control-mode", "explicit", "--load-model", "*")
    process.records = records  # type: ignore[attr-defined]
    process.start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


CLIENTS = [httpclient, grpcclient]


def _client(server: TritiumProcess, module: Any) -> Any:
    return module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url)


def _executions(server: TritiumProcess, model: str) -> int:
    path = server.records / f"{model}.jsonl"  # type: ignore[attr-defined]
    return len(path.read_text().splitlines()) if path.exists() else 0


def _infer(server: TritiumProcess, module: Any, model: str, values: np.ndarray,
           name: str = "INPUT0", output: str = "OUTPUT0") -> list[float]:
    tensor = module.InferInput(name, [len(values)], "FP32")
    tensor.set_data_from_numpy(values.astype(np.float32))
    result = _client(server, module).infer(model, [tensor])
    answer: list[float] = result.as_numpy(output).tolist()
    return answer


def _stats(server: TritiumProcess, model: str) -> dict[str, Any]:
    stats = _client(server, grpcclient).get_inference_statistics(model, as_json=True)
    http_stats = _client(server, httpclient).get_inference_statistics(model)
    model_stats: dict[str, Any] = stats["model_stats"][0]
    http_model = http_stats["model_stats"][0]
    # Both protocols report the same figures.
    for kind in ("cache_hit", "cache_miss", "success"):
        assert int(model_stats["inference_stats"].get(kind, {}).get("count", 0)) == \
            http_model["inference_stats"][kind]["count"]
    return model_stats


def _count(stats: dict[str, Any], kind: str) -> int:
    return int(stats["inference_stats"].get(kind, {}).get("count", 0))


@pytest.mark.parametrize("module", CLIENTS)
def test_repeated_request_is_answered_from_the_cache(server: TritiumProcess,
                                                    module: Any) -> None:
    values = np.array([1, 2, 3] if module is httpclient else [4, 5, 6], dtype=np.float32)
    before, stats_before = _executions(server, "cached"), _stats(server, "cached")
    assert _infer(server, module, "cached", values) == values.tolist()
    assert _executions(server, "cached") == before + 1
    for _ in range(3):
        assert _infer(server, module, "cached", values) == values.tolist()
    assert _executions(server, "cached") == before + 1  # the model never ran again
    # Another shape of the same bytes is another request.
    assert _infer(server, module, "cached", values[:2]) == values[:2].tolist()
    assert _executions(server, "cached") == before + 2
    stats = _stats(server, "cached")
    assert _count(stats, "cache_hit") == _count(stats_before, "cache_hit") + 3
    assert _count(stats, "cache_miss") == _count(stats_before, "cache_miss") + 2
    assert _count(stats, "success") == _count(stats_before, "success") + 5
    # Hits are requests, not inferences or executions, as Triton counts them.
    assert int(stats["inference_count"]) == int(stats_before.get("inference_count", 0)) + 2
    assert int(stats["execution_count"]) == int(stats_before.get("execution_count", 0)) + 2


def test_uncached_model_runs_every_time(server: TritiumProcess) -> None:
    values = np.array([7, 8], dtype=np.float32)
    before = _executions(server, "uncached")
    for _ in range(2):
        _infer(server, httpclient, "uncached", values)
    assert _executions(server, "uncached") == before + 2


def test_cache_metrics_only_for_models_that_cache(server: TritiumProcess) -> None:
    values = np.array([11, 12], dtype=np.float32)
    _infer(server, httpclient, "cached", values)
    _infer(server, httpclient, "cached", values)
    stats = _stats(server, "cached")
    text = requests.get(server.metrics_url, timeout=10).text
    labels = '{model="cached",version="1"}'
    assert f"nv_cache_num_hits_per_model{labels} {_count(stats, 'cache_hit')}" in text
    assert f"nv_cache_num_misses_per_model{labels} {_count(stats, 'cache_miss')}" in text
    assert f"nv_cache_hit_duration_per_model{labels}" in text
    assert f"nv_cache_miss_duration_per_model{labels}" in text
    assert "# TYPE nv_cache_num_hits_per_model counter" in text
    assert 'nv_cache_num_hits_per_model{model="uncached"' not in text


def test_least_recently_used_response_is_evicted(server: TritiumProcess) -> None:
    first, second, third = (np.full(BIG, value, dtype=np.float32) for value in (21, 22, 23))
    before = _executions(server, "cached")
    for values in (first, second, third):  # the third evicts the first
        _infer(server, grpcclient, "cached", values)
    assert _executions(server, "cached") == before + 3
    _infer(server, grpcclient, "cached", third)
    assert _executions(server, "cached") == before + 3  # still held
    _infer(server, grpcclient, "cached", first)
    assert _executions(server, "cached") == before + 4  # evicted: ran again


@pytest.mark.parametrize("module", CLIENTS)
def test_ensemble_caches_at_the_top_level(server: TritiumProcess, module: Any) -> None:
    values = np.array([31, 32] if module is httpclient else [33, 34], dtype=np.float32)
    before = _executions(server, "step")
    for _ in range(3):
        assert _infer(server, module, "cached_ensemble", values, "IN", "OUT") == values.tolist()
    assert _executions(server, "step") == before + 1
    stats = _stats(server, "cached_ensemble")
    assert _count(stats, "cache_hit") >= 2


def test_ensemble_step_caches_by_its_own_config(server: TritiumProcess) -> None:
    values = np.array([41, 42], dtype=np.float32)
    before = _executions(server, "cached")
    for _ in range(2):
        assert _infer(server, httpclient, "ensemble_of_cached", values, "IN", "OUT") == \
            values.tolist()
    assert _executions(server, "cached") == before + 1


@pytest.mark.parametrize("module", CLIENTS)
def test_a_reloaded_model_starts_with_no_entries(server: TritiumProcess, module: Any) -> None:
    values = np.array([51, 52] if module is httpclient else [53, 54], dtype=np.float32)
    before = _executions(server, "cached")
    _infer(server, module, "cached", values)
    _infer(server, module, "cached", values)
    assert _executions(server, "cached") == before + 1
    _client(server, module).load_model("cached")  # loaded again: what it said may change
    _infer(server, module, "cached", values)
    assert _executions(server, "cached") == before + 2


@pytest.mark.parametrize("model", ["cached_decoupled", "cached_streaming_ensemble"])
def test_decoupled_model_with_cache_is_refused(server: TritiumProcess, model: str) -> None:
    index = _client(server, httpclient).get_model_repository_index()
    row = next(r for r in index if r["name"] == model)
    assert row["state"] == "UNAVAILABLE"
    assert (f"Response Cache does not currently support model {model} with 'decoupled' "
            "transaction policy. Please disable the response cache.") in row["reason"]
