"""ModelStreamInfer against a real server: concurrency, interleaving, in-band errors, FINAL."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.server_process import TritiumProcess

FINAL = "triton_final_response"


@pytest.fixture(scope="module")
def stub(server: TritiumProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def request(model: str, request_id: str, datatype: str, data: np.ndarray,
            **params: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="INPUT0", datatype=datatype, shape=list(data.shape))
    if datatype == "BYTES":
        message.raw_input_contents.append(
            b"".join(len(e).to_bytes(4, "little") + e for e in data.tolist()))
    else:
        message.raw_input_contents.append(data.tobytes())
    for key, value in params.items():
        if isinstance(value, bool):
            message.parameters[key].bool_param = value
        else:
            message.parameters[key].int64_param = value
    return message


def seconds(model: str, request_id: str, value: float) -> pb.ModelInferRequest:
    return request(model, request_id, "FP32", np.array([value], dtype=np.float32))


def repeat(request_id: str, count: int, **params: Any) -> pb.ModelInferRequest:
    return request("repeat", request_id, "INT32", np.array([count], dtype=np.int32), **params)


def exchange(stub: service_pb2_grpc.GRPCInferenceServiceStub,
             messages: list[pb.ModelInferRequest]) -> list[pb.ModelStreamInferResponse]:
    """Send every message, half-close, and collect every response until the server ends."""
    return list(stub.ModelStreamInfer(iter(messages), timeout=60))


def test_short_request_overtakes_long_one(stub: service_pb2_grpc.GRPCInferenceServiceStub
                                          ) -> None:
    replies = exchange(stub, [seconds("slow_pair", "long", 0.5),
                              seconds("slow_pair", "short", 0.01)])
    assert [r.infer_response.id for r in replies] == ["short", "long"]
    for reply in replies:
        assert not reply.error_message
        assert reply.infer_response.parameters[FINAL].bool_param is True
        assert reply.infer_response.model_name == "slow_pair"


def test_many_requests_on_one_stream(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    messages = [request("identity_int64", f"r{i}", "INT64", np.arange(i + 1, dtype=np.int64))
                for i in range(20)]
    replies = exchange(stub, messages)
    assert sorted(r.infer_response.id for r in replies) == sorted(m.id for m in messages)
    for reply in replies:
        size = int(reply.infer_response.id[1:]) + 1
        data = np.frombuffer(reply.infer_response.raw_output_contents[0], dtype=np.int64)
        np.testing.assert_array_equal(data, np.arange(size))


def test_errors_are_in_band_and_the_stream_stays_open(
        stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    replies = exchange(stub, [
        seconds("no_such_model", "unknown", 0),
        seconds("raises", "raised", 0),
        request("error_response", "refused", "BYTES", np.array([b"INVALID_ARG"], dtype=object)),
        request("identity_fp32", "bad_param", "FP32", np.zeros(1, np.float32), triton_x=True),
        seconds("slow_pair", "fine", 0.01),
    ])
    by_id = {r.infer_response.id: r for r in replies}
    assert set(by_id) == {"unknown", "raised", "refused", "bad_param", "fine"}
    assert "unknown model" in by_id["unknown"].error_message
    assert by_id["unknown"].infer_response == pb.ModelInferResponse(id="unknown")
    assert by_id["raised"].error_message
    assert by_id["raised"].infer_response.model_name == "raises"
    assert by_id["raised"].infer_response.parameters[FINAL].bool_param is True
    assert "model refused: INVALID_ARG" in by_id["refused"].error_message
    assert "reserved for Triton usage" in by_id["bad_param"].error_message
    assert not by_id["fine"].error_message


def test_decoupled_responses_carry_the_final_flag(
        stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    replies = exchange(stub, [repeat("three", 3)])
    # The model ends with a flag-only FINAL, which writes nothing by default.
    assert [r.infer_response.parameters[FINAL].bool_param for r in replies] == [False] * 3
    values = [np.frombuffer(r.infer_response.raw_output_contents[0], np.int32)[0]
              for r in replies]
    assert values == [0, 1, 2]


def test_empty_final_response_when_asked(stub: service_pb2_grpc.GRPCInferenceServiceStub
                                         ) -> None:
    replies = exchange(stub, [repeat("two", 2, triton_enable_empty_final_response=True)])
    assert [r.infer_response.parameters[FINAL].bool_param for r in replies] == [
        False, False, True]
    last = replies[-1].infer_response
    assert (last.id, last.model_name, last.model_version) == ("two", "repeat", "")
    assert not last.outputs and not last.raw_output_contents
    zero = exchange(stub, [repeat("none", 0, triton_enable_empty_final_response=True)])
    assert len(zero) == 1 and zero[0].infer_response.parameters[FINAL].bool_param


def test_sync_client_stream(server: TritiumProcess) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)))
        count = grpcclient.InferInput("INPUT0", [1], "INT32")
        count.set_data_from_numpy(np.array([2], dtype=np.int32))
        client.async_stream_infer("repeat", [count], request_id="c1",
                                  enable_empty_final_response=True)
        bad = grpcclient.InferInput("INPUT0", [1], "FP32")
        bad.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer("raises", [bad], request_id="c2")
        client.stop_stream()  # half-close: returns once the server finished the stream
    got = [results.get_nowait() for _ in range(results.qsize())]
    errors = [e for _, e in got if e is not None]
    finals = [r.get_response().parameters[FINAL].bool_param for r, e in got if e is None]
    assert len(errors) == 1 and sorted(finals) == [False, False, True]


def test_aio_client_stream(server: TritiumProcess) -> None:
    async def run() -> list[tuple[Any, Any]]:
        async def requests() -> Any:
            for index, value in enumerate((0.3, 0.01)):
                tensor = aioclient.InferInput("INPUT0", [1], "FP32")
                tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
                yield {"model_name": "slow_pair", "inputs": [tensor], "request_id": f"a{index}"}

        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            return [item async for item in client.stream_infer(requests())]

    got = asyncio.run(run())
    assert [error for _, error in got] == [None, None]
    assert [result.get_response().id for result, _ in got] == ["a1", "a0"]
