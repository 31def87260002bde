"""What an instance process hands the python backend: requests read from the wire as is."""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np

from tritium.backends.python.request import ReceivedRequest, RequestContext
from tritium.core.types import DataType, Tensor
from tritium.execution.process import messages as msg
from tritium.execution.process.flags import SlotCancellation
from tritium.execution.process.stub import ChildCore, ChildRequest, ChildStream


def _received(desc: msg.RequestDesc, inputs: dict[str, Tensor], flags: bytearray
              ) -> ReceivedRequest:
    core = ChildCore(desc, inputs)
    cancellation = SlotCancellation(memoryview(flags), desc.slot)
    stream = ChildStream(cast(Any, None), desc.slot)  # nothing is sent here
    admitted = ChildRequest(core, cancellation, stream, desc.slot)
    return ReceivedRequest(cast(Any, admitted), RequestContext(["OUT", "MORE"], False))


def test_the_model_reads_what_the_server_sent() -> None:
    """Every field of the RequestDesc reads through the model's request as a thread
    instance's core request would give it."""
    desc = msg.RequestDesc(3, "req-1", "seq-9", 1, 500, {"p": 7}, ["OUT"], "m", 1, None)
    data = np.arange(4, dtype=np.int32)
    inputs = {"IN": Tensor("IN", DataType.INT32, (4,), data)}
    request = _received(desc, inputs, bytearray(8))
    assert (request.request_id(), request.correlation_id(), request.flags(),
            request.timeout(), request.model_name()) == ("req-1", "seq-9", 1, 500, "m")
    assert json.loads(request.parameters()) == {"p": 7}
    assert request.requested_output_names() == ["OUT"]
    wanted = request.wanted_outputs()
    assert "OUT" in wanted and "OTHER" not in wanted
    tensor = request.input_tensor("IN")
    assert tensor is not None and tensor.as_numpy() is data
    assert request.trace().get_context() is None
    assert ChildCore(desc, inputs).describe() == "req-1"


def test_no_requested_outputs_means_every_output_and_a_flag_reads_through() -> None:
    desc = msg.RequestDesc(5, "", 0, 0, 0, {}, None, "m", 0, None)
    flags = bytearray(8)
    request = _received(desc, {}, flags)
    assert request.requested_output_names() == ["MORE", "OUT"]
    assert ChildCore(desc, {}).describe() == "<id_unknown>"
    assert not request.is_cancelled()
    flags[5] = 1  # the server's cancel of slot 5
    assert request.is_cancelled()
