"""--model-config-name: a model directory's configs/<name>.pbtxt wins over its
config.pbtxt, and a model without that file keeps its config.pbtxt, as in Triton."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

# The server's flag only picks a file: which instance kind runs the models is irrelevant.
IO = _tensor("input", "INPUT0", "FP32", "4") + _tensor("output", "OUTPUT0", "FP32", "4")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("config_selection")
    chosen = add_model(repo, "chosen", "identity", "max_batch_size: 0\n" + IO)
    (chosen / "configs").mkdir()
    (chosen / "configs" / "production.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n' + IO
        + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    (chosen / "configs" / "other.pbtxt").write_text("max_batch_size: -1\n")  # never read
    add_model(repo, "plain", "identity", "max_batch_size: 0\n" + IO)
    process = TritiumProcess(repo, "--model-config-name", "production").start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


def _config(server: TritiumProcess, module: Any, model: str) -> dict[str, Any]:
    if module is httpclient:
        config: dict[str, Any] = httpclient.InferenceServerClient(
            server.http_url).get_model_config(model)
        return config
    answer = grpcclient.InferenceServerClient(server.grpc_url).get_model_config(
        model, as_json=True)
    return dict(answer["config"])


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_named_config_is_read_where_the_model_has_it(server: TritiumProcess,
                                                    module: Any) -> None:
    chosen = _config(server, module, "chosen")
    assert int(chosen["max_batch_size"]) == 8
    assert int(chosen["instance_group"][0]["count"]) == 2
    assert int(_config(server, module, "plain").get("max_batch_size", 0)) == 0


def test_the_chosen_config_serves(server: TritiumProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor.set_data_from_numpy(values)  # a batch of two: only the chosen config batches
    assert client.infer("chosen", [tensor]).as_numpy("OUTPUT0").tolist() == values.tolist()
