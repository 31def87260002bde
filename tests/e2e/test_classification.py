"""Top-N classification outputs with labels from ``label_filename``, over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.server_process import TritiumProcess
from tests.zoo import add_model

CONFIG = """backend: "python"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [3] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] label_filename: "labels.txt" }]
"""
SCORES = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.75]], dtype=np.float32)
TOP_2 = [[b"0.700000:1:dog", b"0.200000:2:emu"], [b"0.750000:2:emu", b"0.500000:0:cat"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("classification")
    model_dir = add_model(repo, "labelled", "identity", CONFIG)
    (model_dir / "labels.txt").write_text("cat\ndog\nemu\n")
    add_model(repo, "label_file_missing", "identity", CONFIG)
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def client(protocol: str, server: TritiumProcess) -> Any:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_top_classes_with_labels(server: TritiumProcess, protocol: str) -> None:
    module, raw = client(protocol, server)
    tensor = module.InferInput("INPUT0", list(SCORES.shape), "FP32")
    tensor.set_data_from_numpy(SCORES)
    wanted = [module.InferRequestedOutput("OUTPUT0", class_count=2)]
    result = raw.infer("labelled", [tensor], outputs=wanted)
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 2)
    assert classes.tolist() == TOP_2
    assert "classification" in raw.get_server_metadata(**_json(protocol))["extensions"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_missing_label_file_fails_the_load(server: TritiumProcess, protocol: str) -> None:
    _, raw = client(protocol, server)
    index = raw.get_model_repository_index(**_json(protocol))
    rows = index if protocol == "http" else index["models"]
    (row,) = [row for row in rows if row["name"] == "label_file_missing"]
    assert row["state"] == "UNAVAILABLE"
    assert "label file 'labels.txt' of output 'OUTPUT0'" in row["reason"]
    assert not raw.is_model_ready("label_file_missing")


def _json(protocol: str) -> dict[str, Any]:
    return {} if protocol == "http" else {"as_json": True}
