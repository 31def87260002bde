"""Model warmup: ``model_warmup`` samples run on every instance before the model is
READY, and a failing sample fails the load with Triton's text."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import instance_kinds
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

FP32, INT32, STRING = 11, 8, 13  # TRITONSERVER_DataType codes


def _warmup_input(name: str, data_type: str, dims: str, data: str) -> str:
    return (f'inputs {{ key: "{name}" value {{ data_type: {data_type} dims: [{dims}] '
            f"{data} }} }}\n")


def _sample(name: str, batch_size: int, inputs: str, count: int = 0) -> str:
    return f'{{ name: "{name}" batch_size: {batch_size} count: {count}\n{inputs}}}'


def _warmup(*samples: str) -> str:
    return "model_warmup [" + ",\n".join(samples) + "]\n"


ZERO_SAMPLE = _sample("zero sample", 1, _warmup_input("INPUT0", "TYPE_FP32", "4",
                                                      "zero_data: true"))


def _probe(repo: Path, name: str, record_dir: Path, config: str) -> Path:
    return add_model(repo, name, "execute_probe",
                     config + _parameter("record_file", f"{record_dir}/{name}.jsonl"))


def build(repo: Path, records: Path) -> None:
    model_dir = _probe(repo, "warm", records, (
        "max_batch_size: 8\n"
        + _tensor("input", "INPUT0", "FP32", "4") + _tensor("input", "INPUT1", "INT32", "2")
        + _tensor("input", "TEXT", "BYTES", "2") + _tensor("input", "RAW", "FP32", "3")
        + _tensor("output", "OUTPUT0", "FP32", "4")
        + "instance_group [{ count: 2 kind: KIND_CPU }]\n"
        + _warmup(
            _sample("pair", 2,
                    _warmup_input("INPUT0", "TYPE_FP32", "4", "zero_data: true")
                    + _warmup_input("INPUT1", "TYPE_INT32", "2", "random_data: true")
                    + _warmup_input("TEXT", "TYPE_STRING", "2", 'input_data_file: "text"')
                    + _warmup_input("RAW", "TYPE_FP32", "3", 'input_data_file: "raw"'),
                    count=3),
            _sample("single", 1,
                    _warmup_input("INPUT0", "TYPE_FP32", "4", "random_data: true")
                    + _warmup_input("INPUT1", "TYPE_INT32", "2", "zero_data: true")
                    + _warmup_input("TEXT", "TYPE_STRING", "2", "random_data: true")
                    + _warmup_input("RAW", "TYPE_FP32", "3", "zero_data: true")),
            _sample("skipped", 0, _warmup_input("INPUT0", "TYPE_FP32", "4",
                                                "zero_data: true")))))
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "text").write_bytes(
        b"".join(struct.pack("<I", len(s)) + s for s in (b"233", b"hi")))
    # One float more than needed: only the first three are read, as Triton reads them.
    (model_dir / "warmup" / "raw").write_bytes(
        np.array([1.5, 2.5, 3.5, 9.0], dtype=np.float32).tobytes())
    io = _tensor("input", "INPUT0", "FP32", "4") + _tensor("output", "OUTPUT0", "FP32", "4")
    _probe(repo, "warm_decoupled", records, DECOUPLED + io + _warmup(ZERO_SAMPLE))
    _probe(repo, "warm_fails", records, io + _parameter("fail", "1") + _warmup(ZERO_SAMPLE))
    _probe(repo, "warm_variable", records,
           _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
           + _warmup(_sample("variable", 1, _warmup_input("INPUT0", "TYPE_FP32", "-1",
                                                          "zero_data: true"))))
    short_dir = _probe(repo, "warm_short_file", records, io + _warmup(
        _sample("short", 1, _warmup_input("INPUT0", "TYPE_FP32", "4",
                                          'input_data_file: "short"'))))
    (short_dir / "warmup").mkdir()
    (short_dir / "warmup" / "short").write_bytes(b"\0" * 10)


@pytest.fixture(scope="module", params=instance_kinds())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("warmup")
    records = tmp_path_factory.mktemp("warmup-records")
    build(repo, records)
    process = TritiumProcess(repo, "--python-instance-kind", request.param,
                             "--model-control-mode", "explicit", "--load-model", "*",
                             "--log-verbose", "1")
    process.records = records  # type: ignore[attr-defined]
    process.start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


def _client(server: TritiumProcess, module: object) -> Any:
    url = server.http_url if module is httpclient else server.grpc_url
    return module.InferenceServerClient(url)  # type: ignore[attr-defined]


def _as_json(module: object) -> dict[str, bool]:
    return {"as_json": True} if module is grpcclient else {}


def _records(server: TritiumProcess, model: str) -> list[dict]:
    path = server.records / f"{model}.jsonl"  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_samples_run_on_every_instance_before_ready(server: TritiumProcess) -> None:
    calls = _records(server, "warm")
    by_instance: dict[str, list[dict]] = {}
    for call in calls:
        by_instance.setdefault(call["instance"], []).append(call)
    assert sorted(by_instance) == ["warm_0_0", "warm_0_1"]
    for instance_calls in by_instance.values():
        # "pair" three times (two requests in one execute), then "single"; "skipped" never.
        assert [len(c["requests"]) for c in instance_calls] == [2, 2, 2, 1]
        pair = instance_calls[0]["requests"][0]
        assert pair["INPUT0"] == [[1, 4], FP32, [0.0] * 4]
        assert pair["INPUT1"][:2] == [[1, 2], INT32]
        assert pair["TEXT"] == [[1, 2], STRING, ["233", "hi"]]
        assert pair["RAW"] == [[1, 3], FP32, [1.5, 2.5, 3.5]]
        single = instance_calls[3]["requests"][0]
        assert single["TEXT"] == [[1, 2], STRING, ["", ""]]  # random strings are empty
        assert single["INPUT1"] == [[1, 2], INT32, [0, 0]]
    log = server.log()
    running = log.index("is running warmup sample 'single' for iteration 1")
    assert running < log.index("model 'warm' version 1 is READY")
    assert "warmup sample 'skipped'" not in log
    # Warmup reaches the instances directly: no request is counted (read before any test
    # infers, over both protocols).
    for module in (httpclient, grpcclient):
        stats = _client(server, module).get_inference_statistics("warm", **_as_json(module))
        model = stats["model_stats"][0]
        assert int(model.get("inference_count", 0)) == int(model.get("execution_count", 0)) == 0


@pytest.mark.parametrize("client_module", [httpclient, grpcclient])
def test_warmed_model_serves(server: TritiumProcess,
                                                       client_module: object) -> None:
    client = _client(server, client_module)
    assert client.is_model_ready("warm")
    assert client.is_model_ready("warm_decoupled")
    assert len(_records(server, "warm_decoupled")) == 1
    inputs = []
    for name, datatype, value in (("INPUT0", "FP32", np.arange(4, dtype=np.float32)),
                                  ("INPUT1", "INT32", np.zeros(2, dtype=np.int32)),
                                  ("TEXT", "BYTES", np.array([b"a", b"b"], dtype=object)),
                                  ("RAW", "FP32", np.zeros(3, dtype=np.float32))):
        tensor = client_module.InferInput(name, [1, len(value)], datatype)  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(value.reshape(1, -1))
        inputs.append(tensor)
    result = client.infer("warm", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [[0.0, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize(("model", "reason"), [
    ("warm_fails", "failed to run warmup sample 'zero sample': An Error Occurred; "),
    ("warm_variable", "warmup setting expects all variable-size dimensions are specified "
                      "for input 'INPUT0'"),
    ("warm_short_file", "warmup setting expects 16 bytes, but the data provided from "
                        "shortonly has 10 bytes"),
])
@pytest.mark.parametrize("client_module", [httpclient, grpcclient])
def test_failing_warmup_fails_the_load(server: TritiumProcess, model: str, reason: str,
                                       client_module: object) -> None:
    client = _client(server, client_module)
    assert not client.is_model_ready(model)
    index = client.get_model_repository_index(**_as_json(client_module))
    rows = index if client_module is httpclient else index["models"]
    row = next(r for r in rows if r["name"] == model)
    assert row["state"] == "UNAVAILABLE" and row["reason"] == reason
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(model)
    assert reason in str(caught.value)
