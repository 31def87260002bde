"""--model-namespacing: models of one name in different repositories, each ensemble using
the one of its own repository, and a request naming a shared name refused as ambiguous,
as Triton's L0_model_namespacing has it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.ensemble_zoo import add_ensemble
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

IO = ("".join(_tensor("input", name, "INT32", "16") for name in ("INPUT0", "INPUT1"))
      + "".join(_tensor("output", name, "INT32", "16") for name in ("OUTPUT0", "OUTPUT1")))
MAPS = ({"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})
DATA = np.arange(16, dtype=np.int32)
ADD_SUB = (DATA + DATA, DATA - DATA)
SUB_ADD = (DATA - DATA, DATA + DATA)
PROTOCOLS = ("http", "grpc")


def build(root: Path) -> tuple[Path, Path]:
    """Two repositories, each with its own ``composing_model`` (add/sub, sub/add) and
    ``simple_ensemble`` over it, and an ensemble of a name of its own."""
    repos = root / "addsub_repo", root / "subadd_repo"
    for repo, swap, own in zip(repos, ("false", "true"), ("simple_addsub", "simple_subadd"),
                               strict=True):
        add_model(repo, "composing_model", "add_sub", IO + _parameter("swap", swap))
        for ensemble in ("simple_ensemble", own):
            add_ensemble(repo, ensemble, IO, [("composing_model", *MAPS)])
    add_model(repos[0], "composing_addsub", "add_sub", IO)
    return repos


def serve(root: Path, *args: str) -> TritiumProcess:
    first, second = build(root)
    return TritiumProcess(first, "--model-repository", str(second), *args).start(timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    process = serve(tmp_path_factory.mktemp("namespacing"), "--model-namespacing=true")
    yield process
    assert process.stop() == 0, process.log()


def client(server: TritiumProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer(server: TritiumProcess, protocol: str, model: str) -> tuple[np.ndarray, np.ndarray]:
    module: Any = httpclient if protocol == "http" else grpcclient
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [16], "INT32")
        tensor.set_data_from_numpy(DATA)
        inputs.append(tensor)
    result = client(server, protocol).infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def same(got: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_ensemble_uses_the_model_of_its_own_repository(server: TritiumProcess,
                                                            protocol: str) -> None:
    assert same(infer(server, protocol, "simple_addsub"), ADD_SUB)
    assert same(infer(server, protocol, "simple_subadd"), SUB_ADD)
    assert same(infer(server, protocol, "composing_addsub"), ADD_SUB)  # a unique name


@pytest.mark.parametrize("model", ["composing_model", "simple_ensemble"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_name_of_several_repositories_is_ambiguous(server: TritiumProcess, protocol: str,
                                                     model: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        infer(server, protocol, model)
    assert caught.value.message() == (
        f"There are 2 identifiers of model '{model}' in global map, model namespace must be "
        "provided to resolve ambiguity.")
    assert caught.value.status() == ("400" if protocol == "http"
                                     else "StatusCode.INVALID_ARGUMENT")


def test_the_index_lists_the_models_of_every_repository(server: TritiumProcess) -> None:
    index = client(server, "http").get_model_repository_index()
    rows = [(row["name"], row.get("state")) for row in index]
    assert rows.count(("composing_model", "READY")) == 2
    assert rows.count(("simple_ensemble", "READY")) == 2
    assert client(server, "http").is_server_ready()


def test_metrics_label_each_model_with_its_repository(server: TritiumProcess) -> None:
    """As Triton's L0_metrics namespacing test: a ``namespace`` label, the repository."""
    text = requests.get(server.metrics_url, timeout=10).text
    for repo in (server.repository, server.repository.parent / "subadd_repo"):
        assert f'namespace="{repo}"' in text
    series = [line.split(" ")[0] for line in text.splitlines()
              if line.startswith("nv_inference_request_success{")
              and 'model="composing_model"' in line]
    assert len(series) == len(set(series)) == 2


def test_without_the_flag_a_shared_name_does_not_load(tmp_path: Path) -> None:
    process = serve(tmp_path, "--strict-readiness=false")
    try:
        assert 'namespace="' not in requests.get(process.metrics_url, timeout=10).text
        index = client(process, "http").get_model_repository_index()
        states = {row["name"]: (row.get("state"), row.get("reason")) for row in index}
        assert states["composing_model"] == ("UNAVAILABLE",
                                             "model appears in two or more repositories")
        assert states["composing_addsub"][0] == "READY"
    finally:
        assert process.stop() == 0, process.log()


def ready(http: Any) -> list[str]:
    return [row["name"] for row in http.get_model_repository_index()
            if row.get("state") == "READY"]


def test_explicit_load_of_a_shared_name_loads_each(tmp_path: Path) -> None:
    process = serve(tmp_path, "--model-namespacing=true", "--model-control-mode=explicit")
    try:
        http = client(process, "http")
        http.load_model("simple_ensemble")  # both, each with its own composing model
        assert sorted(ready(http)) == ["composing_model"] * 2 + ["simple_ensemble"] * 2
        http.unload_model("composing_model")
        assert "composing_model" not in ready(http)
    finally:
        assert process.stop() == 0, process.log()
