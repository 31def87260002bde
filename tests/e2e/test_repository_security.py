"""The load API on a real explicit-mode server, tried as an attacker would: names that are
not one path component and override files that would leave their directory are refused
before anything touches the disk, and uploaded files live in a private directory that goes
away with the model."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import MODELS_SOURCE, add_model

IO = {"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
CONFIG = json.dumps({"backend": "python", **IO})
IDENTITY = (MODELS_SOURCE / "identity.py").read_text()
BAD_INIT = (MODELS_SOURCE / "bad_init.py").read_text()
OVERRIDE_GLOB = "tritium-override-*"


class Sandbox:
    """Where the server's repository and its temporary directory live, and how to see that
    nothing in either changed."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = root / "repo"
        # Deep enough that "../../x" from an override directory stays inside the sandbox.
        self.tmp = root / "a" / "b" / "tmp"
        self.tmp.mkdir(parents=True)

    def files(self) -> dict[str, str]:
        """Every file under the sandbox with a digest of its bytes (caches left out)."""
        return {str(p.relative_to(self.root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts}

    def override_dirs(self) -> list[Path]:
        return sorted(self.tmp.glob(OVERRIDE_GLOB))

    def marker(self, tag: str) -> Path:
        return self.root / f"ran_{tag}"

    def tell_tale(self, tag: str) -> str:
        """Model code that leaves a file behind if it is ever imported."""
        return f"open({str(self.marker(tag))!r}, 'w').close()\n" + IDENTITY


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    box = Sandbox(tmp_path_factory.mktemp("sandbox"))
    add_model(box.repo, "served", "identity", 'backend: "python"\n'
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    return box


@pytest.fixture(scope="module")
def server(sandbox: Sandbox) -> Iterator[TritiumProcess]:
    process = TritiumProcess(sandbox.repo, "--model-control-mode=explicit",
                             "--load-model", "served", "--exit-timeout-secs", "2",
                             env={"TMPDIR": str(sandbox.tmp)}).start()
    yield process
    assert process.stop() == 0, process.log()
    assert sandbox.override_dirs() == []  # shutdown removes what the models ran from


def url(server: TritiumProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def load(server: TritiumProcess, quoted_name: str, parameters: dict[str, Any]
         ) -> requests.Response:
    return requests.post(url(server, f"/v2/repository/models/{quoted_name}/load"),
                         json={"parameters": parameters}, timeout=60)


def upload(source: str, path: str = "1/model.py") -> dict[str, Any]:
    return {"config": CONFIG, f"file:{path}": base64.b64encode(source.encode()).decode()}


def infer(server: TritiumProcess, quoted_name: str) -> requests.Response:
    body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
    return requests.post(url(server, f"/v2/models/{quoted_name}/infer"), json=body, timeout=30)


def ready(server: TritiumProcess) -> int:
    return requests.get(url(server, "/v2/health/ready"), timeout=10).status_code


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    # Unload finishes in the background; nothing outside the server can be awaited.
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def grpc_status(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def bad_names(sandbox: Sandbox) -> list[tuple[str, str, Path | None]]:
    """(name as sent in the URL, words of the refusal, where the old server wrote)."""
    return [
        (quote(str(sandbox.root / "abs_target"), safe=""), "path traversal",
         sandbox.root / "abs_target"),
        ("..%2F..%2Frel_target", "path traversal", sandbox.root / "a" / "b" / "rel_target"),
        # From the override directory up into the server's own repository.
        ("..%2F..%2F..%2F..%2Frepo%2Fserved", "path traversal", None),
        ("a%5Cb", "path traversal", None),
        ("a%00b", "control characters", None),
        (".hidden", "must not start with '.'", None),
        ("%2E%2E", "path traversal", None),
        ("x" * 300, "at most 255 bytes", None),
        ("a%3Bb", "must not contain any of", None),
        # The python backend's words, which Triton's model-name tests match.
        ("model%3Btest", "Invalid stub name: contains invalid characters", None),
        ("model%5Ctest", "Invalid stub name: contains invalid characters", None),
    ]


# -- names ------------------------------------------------------------------------------------
def test_traversal_names_are_refused_over_http_and_nothing_is_written(
        server: TritiumProcess, sandbox: Sandbox) -> None:
    before = sandbox.files()
    for index, (name, words, target) in enumerate(bad_names(sandbox)):
        reply = load(server, name, upload(sandbox.tell_tale(f"http{index}")))
        assert reply.status_code == 400, (name, reply.text)
        assert words in reply.json()["error"], (name, reply.text)
        if target is not None:
            assert not target.exists()
        assert not sandbox.marker(f"http{index}").exists()
    assert sandbox.files() == before
    assert sandbox.override_dirs() == []
    assert ready(server) == 200


@pytest.mark.parametrize("name", ["../../rel_grpc", "{root}/abs_grpc", "a\\b", "a\x00b",
                                  ".x"])
def test_traversal_names_are_refused_over_grpc(server: TritiumProcess, sandbox: Sandbox,
                                               name: str) -> None:
    name = name.format(root=sandbox.root)  # even a regression writes inside the sandbox
    before = sandbox.files()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        error = grpc_status(lambda: client.load_model(
            name, config=CONFIG, files={"file:1/model.py": sandbox.tell_tale("grpc").encode()}))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert "invalid model name" in str(error.message())
        error = grpc_status(lambda: client.unload_model(name))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert not sandbox.marker("grpc").exists()
    assert sandbox.files() == before
    assert sandbox.override_dirs() == []


def test_every_endpoint_that_takes_a_name_refuses_a_traversal_name(
        server: TritiumProcess) -> None:
    name = "..%2F..%2Fx"
    for method, path in [("GET", f"/v2/models/{name}"), ("GET", f"/v2/models/{name}/config"),
                         ("GET", f"/v2/models/{name}/stats"),
                         ("POST", f"/v2/repository/models/{name}/unload")]:
        reply = requests.request(method, url(server, path), timeout=10)
        assert reply.status_code == 400, (path, reply.text)
        assert "invalid model name" in reply.json()["error"], path
    reply = infer(server, name)
    assert reply.status_code == 400 and "invalid model name" in reply.json()["error"]
    assert requests.get(url(server, f"/v2/models/{name}/ready"), timeout=10).status_code == 400
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for call in (client.get_model_metadata, client.get_model_config,
                     client.get_inference_statistics):
            error = grpc_status(lambda call=call: call("../../x"))  # type: ignore[misc]
            assert error.status() == "StatusCode.INVALID_ARGUMENT", call
            assert "invalid model name" in str(error.message())


# -- override files -----------------------------------------------------------------------------
@pytest.mark.parametrize("path, words", [
    ("../escape.py", "within the model directory"),
    ("1/../../../escape.py", "within the model directory"),
    ("/../escape.py", "within the model directory"),
    ("1/model\x00.py", "control character"),
    ("/".join(["d"] * 2000) + "/model.py", "bytes long"),
    ("/".join(["d"] * 40) + "/model.py", "levels deep"),
    ("1\\..\\..\\escape.py", "backslash"),
])
def test_override_paths_outside_the_model_are_refused_before_writing(
        server: TritiumProcess, sandbox: Sandbox, path: str, words: str) -> None:
    path = path.format(root=sandbox.root)
    before = sandbox.files()
    parameters = {**upload(sandbox.tell_tale("path")), **upload(IDENTITY, path)}
    reply = load(server, "uploaded_bad", parameters)
    assert reply.status_code == 400, reply.text
    assert "invalid file override path" in reply.json()["error"]
    assert words in reply.json()["error"]
    assert sandbox.files() == before and sandbox.override_dirs() == []
    assert not sandbox.marker("path").exists()
    assert ready(server) == 200


@pytest.mark.parametrize("path, words", [
    ("../../escape.py", "within the model directory"),
    ("1/model\x00.py", "control character"),
    ("/".join(["d"] * 2000) + "/model.py", "bytes long"),
])
def test_grpc_override_paths_are_refused_before_writing(
        server: TritiumProcess, sandbox: Sandbox, path: str, words: str) -> None:
    before = sandbox.files()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        error = grpc_status(lambda: client.load_model(
            "uploaded_bad", config=CONFIG,
            files={"file:1/model.py": IDENTITY.encode(), f"file:{path}": b"x"}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert words in str(error.message())
    assert sandbox.files() == before and sandbox.override_dirs() == []


def test_a_leading_slash_lands_inside_the_model_directory(server: TritiumProcess,
                                                          sandbox: Sandbox) -> None:
    """Triton joins a ``file:`` key onto the model directory before checking it stays
    inside, so its own tests' ``file:/1/model.py`` is the version file and an "absolute"
    key is one more file under the model: over HTTP and gRPC, nothing lands outside."""
    outside = sandbox.root / "escape.py"
    parameters = {"config": CONFIG,
                  "file:/1/model.py": base64.b64encode(IDENTITY.encode()).decode(),
                  f"file:{outside}": base64.b64encode(b"x").decode()}
    assert load(server, "slashed", parameters).status_code == 200
    assert infer(server, "slashed").json()["outputs"][0]["data"] == [1.0, 2.0]
    [model_dir] = [found / "slashed" for found in sandbox.override_dirs()]
    assert (model_dir / "1" / "model.py").read_text() == IDENTITY
    assert (model_dir / str(outside).lstrip("/")).read_bytes() == b"x"
    assert not outside.exists()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.load_model("slashed", config=CONFIG,
                          files={"file:/1/model.py": IDENTITY.encode()})
        assert client.is_model_ready("slashed")
        client.unload_model("slashed")
    wait_until(lambda: sandbox.override_dirs() == [])
    assert not outside.exists()


def test_override_directory_is_private_and_removed_on_unload_and_reload(
        server: TritiumProcess, sandbox: Sandbox) -> None:
    assert load(server, "uploaded", upload(IDENTITY)).status_code == 200
    [first] = sandbox.override_dirs()
    assert stat.S_IMODE(first.stat().st_mode) == 0o700
    assert (first / "uploaded" / "1" / "model.py").read_text() == IDENTITY
    assert infer(server, "uploaded").json()["outputs"][0]["data"] == [1.0, 2.0]

    assert load(server, "uploaded", upload(IDENTITY + "\n# two\n")).status_code == 200
    wait_until(lambda: not first.exists())  # replaced: goes once the old version drained
    [second] = sandbox.override_dirs()
    assert second != first

    assert requests.post(url(server, "/v2/repository/models/uploaded/unload"),
                         timeout=30).status_code == 200
    wait_until(lambda: sandbox.override_dirs() == [])


def test_overriding_a_repository_model_leaves_its_files_alone(
        server: TritiumProcess, sandbox: Sandbox) -> None:
    before = sandbox.files()
    doubled = IDENTITY.replace("tensor.as_numpy())", "tensor.as_numpy() * 2)")
    assert load(server, "served", upload(doubled)).status_code == 200
    assert infer(server, "served").json()["outputs"][0]["data"] == [2.0, 4.0]
    # A plain load goes back to the repository's own, unchanged model.
    assert load(server, "served", {}).status_code == 200
    assert infer(server, "served").json()["outputs"][0]["data"] == [1.0, 2.0]
    wait_until(lambda: sandbox.override_dirs() == [])
    assert sandbox.files() == before


def test_a_failed_override_load_leaves_no_directory(server: TritiumProcess,
                                                    sandbox: Sandbox) -> None:
    reply = load(server, "broken_upload", upload(BAD_INIT))
    assert reply.status_code == 400
    assert "initialize refuses to start" in reply.json()["error"]
    assert sandbox.override_dirs() == []
    assert requests.post(url(server, "/v2/repository/models/broken_upload/unload"),
                         timeout=30).status_code == 200
    # A config refused before any model code runs fails before any file is written.
    bad = {**upload(IDENTITY), "config": json.dumps({"name": "other", "backend": "python",
                                                     **IO})}
    reply = load(server, "broken_config", bad)
    assert reply.status_code == 400 and "directory name" in reply.json()["error"]
    assert sandbox.override_dirs() == []
    assert ready(server) == 200
