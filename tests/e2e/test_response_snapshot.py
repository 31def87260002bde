"""A response holds its tensors as they were when the model sent it, as under Triton: a
model that overwrites one array between sends streams every value, under either kind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import add_model

CONFIG = ('backend: "python"\n'
          'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1] }]\n'
          'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [1] }]\n'
          "model_transaction_policy { decoupled: true }\n")


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[TritiumProcess]:
    repo: Path = tmp_path_factory.mktemp(request.param) / "repo"
    add_model(repo, "reused_buffer", "reused_buffer", CONFIG)
    server = TritiumProcess(repo, "--python-instance-kind", request.param).start()
    yield server
    server.stop()


def test_each_response_keeps_what_was_sent(server: TritiumProcess) -> None:
    reply = requests.post(f"http://{server.http_url}/v2/models/reused_buffer/generate_stream",
                          json={"INPUT0": [5]}, timeout=30, stream=True)
    assert reply.status_code == 200, reply.text
    values = [json.loads(line[len(b"data: "):])["OUTPUT0"]
              for line in reply.iter_lines() if line.startswith(b"data: ")]
    assert values == [0, 1, 2, 3, 4] or values == [[0], [1], [2], [3], [4]], values
