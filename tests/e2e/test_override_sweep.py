"""Override directories a killed server could not remove are swept up by the next one, and
a live server's are left alone."""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path

import requests

from tests.server_process import TritiumProcess
from tests.zoo import MODELS_SOURCE
from tritium.repository.overrides import DIR_PREFIX

INSTANCE_KINDS = ("thread",)

CONFIG = {"backend": "python",
          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}


def start(repo: Path, tmp: Path) -> TritiumProcess:
    return TritiumProcess(repo, "--model-control-mode", "explicit",
                          env={"TMPDIR": str(tmp)}).start()


def upload(server: TritiumProcess, name: str) -> None:
    source = (MODELS_SOURCE / "identity.py").read_bytes()
    reply = requests.post(
        f"http://{server.http_url}/v2/repository/models/{name}/load",
        json={"parameters": {"config": json.dumps(CONFIG),
                             "file:1/model.py": base64.b64encode(source).decode()}},
        timeout=60)
    assert reply.status_code == 200, reply.text


def leftovers(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(f"{DIR_PREFIX}*"))


def test_a_killed_servers_uploads_are_removed_at_the_next_start(tmp_path: Path) -> None:
    repo, tmp = tmp_path / "repo", tmp_path / "tmp"
    repo.mkdir()
    tmp.mkdir()
    killed = start(repo, tmp)
    upload(killed, "uploaded")
    assert len(leftovers(tmp)) == 1
    os.kill(killed.pid, signal.SIGKILL)
    killed.stop()
    assert len(leftovers(tmp)) == 1  # nobody removed it
    live = start(repo, tmp)
    try:
        assert leftovers(tmp) == []
        upload(live, "again")
        mine = leftovers(tmp)
        assert len(mine) == 1 and f"{DIR_PREFIX}{live.pid}-" in mine[0].name
        other = start(repo, tmp)  # a second server beside it sweeps nothing of the first's
        assert leftovers(tmp) == mine
        assert other.stop() == 0, other.log()
    finally:
        assert live.stop() == 0, live.log()
    assert leftovers(tmp) == []
