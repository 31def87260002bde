"""What an idle instance process of a plain synchronous model carries: numpy and the
backend, not asyncio (nor the ssl it imports), protobuf, tritonclient or ml_dtypes. Those
are imported when a model needs them (``async def execute``, a BF16 tensor, the model's
own imports), so an instance process stays small (bench/process_instances.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "BYTES", "1")
NOT_IMPORTED = ("asyncio", "ssl", "google.protobuf", "tritonclient", "ml_dtypes")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("footprint_repo")
    add_model(repo, "probe_process", "modules_probe",
              IO + _parameter("TRITIUM_INSTANCE_KIND", "process"))
    # The same model on a thread of the server, which imports all of them: the probe
    # reads the modules of the process it runs in.
    add_model(repo, "probe_thread", "modules_probe",
              IO + _parameter("TRITIUM_INSTANCE_KIND", "thread"))
    process = TritiumProcess(repo).start(timeout=180)
    yield process
    process.stop()


def _facts(server: TritiumProcess, model: str) -> dict[str, Any]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [0]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=60)
    assert reply.status_code == 200, reply.text
    facts: dict[str, Any] = json.loads(reply.json()["outputs"][0]["data"][0])
    return facts


def _found(modules: list[str], wanted: tuple[str, ...]) -> list[str]:
    """The modules of ``wanted`` (or their submodules) that ``modules`` holds."""
    return [name for name in modules
            if any(name == top or name.startswith(f"{top}.") for top in wanted)]


def test_a_sync_models_process_imports_none_of_the_heavy_modules(
        server: TritiumProcess) -> None:
    facts = _facts(server, "probe_process")
    assert facts["pid"] != server.pid
    assert "numpy" in facts["modules"]
    assert _found(facts["modules"], NOT_IMPORTED) == []


def test_the_probe_sees_them_where_they_are_imported(server: TritiumProcess) -> None:
    facts = _facts(server, "probe_thread")
    assert facts["pid"] == server.pid
    found = {name.split(".")[0] for name in _found(facts["modules"], NOT_IMPORTED)}
    assert {"asyncio", "google", "tritonclient"} <= found


def test_the_idle_process_is_small(server: TritiumProcess) -> None:
    """A bound with room (the figure is ~29 MiB with numpy 2.4 on Python 3.11): it fails
    when something heavy comes back (asyncio with ssl adds ~6 MiB, grpc ~30)."""
    pid = _facts(server, "probe_process")["pid"]
    status = Path(f"/proc/{pid}/status").read_text()
    rss_mib = int(status.split("VmRSS:")[1].split()[0]) / 1024
    assert rss_mib < 36, status
