"""The model API's Triton habits, without a server: bytes names, the model's own imports
and sys.argv, writable tensors, and a non-decoupled sender ending at its first response."""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from tests.unit.admitted import admit
from tritium.backends.python import importer
from tritium.backends.python.request import ReceivedRequest, RequestContext
from tritium.core.request import InferenceRequest as CoreRequest
from tritium.core.types import DataType
from tritium.core.types import Tensor as CoreTensor

MODEL = """
import json
import helper

def helper_name():
    import helper as again
    return again.NAME

NAME_AT_IMPORT = helper.NAME
JSON_FILE = json.__file__
"""


@pytest.fixture
def models(tmp_path: Path) -> Iterator[list[Any]]:
    """Two models whose version directories hold a helper.py (and a json.py) each."""
    modules: list[Any] = []
    for name in ("first", "second"):
        version_dir = tmp_path / name / "1"
        version_dir.mkdir(parents=True)
        (version_dir / "model.py").write_text(textwrap.dedent(MODEL))
        (version_dir / "helper.py").write_text(f"NAME = {name!r}\n")
        (version_dir / "json.py").write_text("raise ImportError('the stdlib json wins')\n")
        modules.append(importer.import_model_file(version_dir / "model.py"))
    yield modules
    for module in modules:
        importer.forget_module(module)


def test_each_model_imports_its_own_helper(models: list[Any]) -> None:
    first, second = models
    assert (first.NAME_AT_IMPORT, second.NAME_AT_IMPORT) == ("first", "second")
    # Later, inside a function (execute), the same: the directory stays importable.
    assert (first.helper_name(), second.helper_name()) == ("first", "second")
    assert "helper" not in sys.modules


def test_installed_modules_win_over_model_files(models: list[Any]) -> None:
    """Triton appends the model's directories to sys.path: the stdlib json comes first."""
    assert not models[0].JSON_FILE.startswith(str(Path(models[0].__file__).parent))


def test_model_directories_stay_on_sys_path_until_forgotten(tmp_path: Path) -> None:
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text("X = 1\n")
    module = importer.import_model_file(version_dir / "model.py")
    assert str(version_dir) in sys.path and str(version_dir.parent) in sys.path
    importer.forget_module(module)
    assert str(version_dir) not in sys.path and str(version_dir.parent) not in sys.path


def test_model_code_gets_an_argv_of_its_own(tmp_path: Path) -> None:
    """An embedded interpreter started with no arguments has sys.argv == [""]."""
    version_dir = tmp_path / "m" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.py").write_text("import sys\nARGV = list(sys.argv)\n")
    module = importer.import_model_file(version_dir / "model.py")
    try:
        assert module.ARGV == [""]
    finally:
        importer.forget_module(module)


def test_bls_request_takes_bytes_names() -> None:
    request = pb_utils.InferenceRequest(
        request_id=b"id-1", model_name=b"add_sub", requested_output_names=[b"OUT", "OUT2"],
        inputs=[pb_utils.Tensor(b"INPUT0", np.zeros(2, np.float32))])
    assert (request.model_name(), request.request_id()) == ("add_sub", "id-1")
    assert request.requested_output_names() == ["OUT", "OUT2"]
    assert request.inputs()[0].name() == "INPUT0"


def test_other_text_arguments_take_bytes(caplog: pytest.LogCaptureFixture) -> None:
    """TritonError's message, MetricFamily's name and description and Logger messages are
    std::string in Triton's bindings as well."""
    assert pb_utils.TritonError(b"went wrong").message() == "went wrong"
    counter = pb_utils.MetricFamily.COUNTER
    family = pb_utils.MetricFamily(b"model_api_bytes_total", b"about", counter)
    assert (family.name, family.description) == ("model_api_bytes_total", "about")
    with caplog.at_level(logging.INFO, logger="tritium.model"):
        pb_utils.Logger.log_info(b"said in bytes")  # type: ignore[arg-type]
    assert [record.getMessage() for record in caplog.records] == ["said in bytes"]


def test_read_only_data_becomes_writable_once() -> None:
    """A binary input is a view of immutable request bytes; the model gets a writable
    array (one copy, kept) that exports through DLPack."""
    data = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.float32)
    assert not data.flags.writeable
    core = CoreTensor("INPUT0", DataType.FP32, (4,), data)
    tensor = pb_utils.Tensor._wrap(core)
    array = tensor.as_numpy()
    assert array.flags.writeable and tensor.as_numpy() is array and core.data is array
    array += 1
    through = np.from_dlpack(tensor)
    assert np.shares_memory(through, array)
    back = pb_utils.Tensor.from_dlpack("OUT", tensor.to_dlpack())
    assert back.as_numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_writable_data_is_not_copied() -> None:
    data = np.arange(3, dtype=np.int32)
    tensor = pb_utils.Tensor._wrap(CoreTensor("X", DataType.INT32, (3,), data))
    assert tensor.as_numpy() is data and np.shares_memory(np.from_dlpack(tensor), data)


def test_non_decoupled_request_ends_with_its_first_response() -> None:
    """Triton's response-sender tests: the first response reaches the client, a second
    raises in the model, and nothing after the first is delivered."""

    async def main() -> list[Any]:
        admitted = admit(CoreRequest(model_name="m", inputs={}),
                         loop=asyncio.get_running_loop())
        request = ReceivedRequest(admitted, RequestContext(["OUT"], decoupled=False))
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([]))
        with pytest.raises(pb_utils.TritonModelException, match="more than one response"):
            sender.send(pb_utils.InferenceResponse([]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        async with asyncio.timeout(10):
            return [response async for response in admitted.stream]

    [response] = asyncio.run(main())
    assert response.final and response.error is None

