"""gRPC ways to leave: stub or tritonclient (sync, aio) cancels, deadlines, a killed process."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.leaving import DEADLINE_S, Inputs, Sent, Way
from tests.server_process import TritiumProcess

# A unary call answers once, so a decoupled model is reached through the stream only.
CELLS = [("unary", "slow"), ("stream", "slow"), ("stream", "slow_decoupled")]
JOIN_S = 30.0


def infer_request(model: str, request_id: str, inputs: Inputs) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, value in inputs.items():
        if isinstance(value, str):
            request.inputs.add(name=name, datatype="BYTES", shape=[1])
            encoded = value.encode()
            request.raw_input_contents.append(len(encoded).to_bytes(4, "little") + encoded)
        else:
            request.inputs.add(name=name, datatype="FP32", shape=[1])
            request.raw_input_contents.append(np.array([value], dtype=np.float32).tobytes())
    return request


def client_inputs(inputs: Inputs) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in inputs.items():
        text = isinstance(value, str)
        tensor = grpcclient.InferInput(name, [1], "BYTES" if text else "FP32")
        tensor.set_data_from_numpy(np.array([value], dtype=object if text else np.float32))
        tensors.append(tensor)
    return tensors


def held(requests: list[Any], hold: threading.Event) -> Iterator[Any]:
    """Sends ``requests``, then keeps the stream open (no half-close) until ``hold`` is set."""
    yield from requests
    hold.wait(60)


class StubSent(Sent):
    """One request on the generated stub's unary or stream call, cancelled or left to its
    deadline; a stream is never half-closed, so only the cancel or the deadline ends it."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        self.way, self.request_id = way, request_id
        self.channel = grpc.insecure_channel(server.grpc_url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        request = infer_request(way.model, request_id, inputs)
        self.hold = threading.Event()
        self.replies: queue.Queue[Any] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.sent_at = time.monotonic()
        if way.route == "unary":
            self.call = stub.ModelInfer.future(request, timeout=way.deadline_s)
            self.reader: threading.Thread | None = None
        else:
            self.call = stub.ModelStreamInfer(held([request], self.hold), timeout=way.deadline_s)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.replies.put(reply)
        except grpc.RpcError as exc:
            self.error = exc

    def leave(self) -> float:
        if self.way.deadline_s is not None:
            return self.sent_at + self.way.deadline_s
        left_at = time.monotonic()
        self.call.cancel()
        self.hold.set()
        return left_at

    def answered(self) -> None:
        if self.reader is None:
            assert self.call.result(timeout=JOIN_S).id == self.request_id
        else:
            reply = self.replies.get(timeout=JOIN_S)
            assert reply.infer_response.id == self.request_id and not reply.error_message

    def check_client(self) -> None:
        if self.way.deadline_s is None:
            return
        if self.reader is None:
            error = self.call.exception(timeout=JOIN_S)
        else:
            self.reader.join(JOIN_S)
            error = self.error
        assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error

    def close(self) -> None:
        self.call.cancel()
        self.hold.set()
        self.channel.close()


KILLABLE_CLIENT = """
import sys, threading, grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
url, rpc, wire = sys.argv[1:4]
request = service_pb2.ModelInferRequest.FromString(bytes.fromhex(wire))
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))
def held():
    yield request
    threading.Event().wait()
if rpc == "unary":
    stub.ModelInfer(request)
else:
    for _ in stub.ModelStreamInfer(held()):
        pass
"""


class KilledSent(Sent):
    """The request sent from a child process; leaving kills that process."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        wire = infer_request(way.model, request_id, inputs).SerializeToString().hex()
        self.client = subprocess.Popen([sys.executable, "-c", KILLABLE_CLIENT, server.grpc_url,
                                        way.route, wire])

    def leave(self) -> float:
        left_at = time.monotonic()
        self.close()
        return left_at

    def close(self) -> None:
        self.client.kill()
        self.client.wait()


class ClientUnarySent(Sent):
    """tritonclient's async_infer, whose returned call the client cancels."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[dict[str, Any]] = queue.Queue()
        self.call = self.client.async_infer(way.model, client_inputs(inputs),
                                            lambda **outcome: self.results.put(outcome),
                                            request_id=request_id)

    def leave(self) -> float:
        left_at = time.monotonic()
        self.call.cancel()
        return left_at

    def answered(self) -> None:
        outcome = self.results.get(timeout=JOIN_S)
        assert outcome["error"] is None and outcome["result"].as_numpy("OUTPUT0") is not None

    def close(self) -> None:
        self.client.close()


class ClientTimeoutSent(Sent):
    """tritonclient's blocking infer with client_timeout; the deadline does the leaving."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        assert way.deadline_s is not None
        self.deadline_s = way.deadline_s
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.error: InferenceServerException | None = None
        self.sent_at = time.monotonic()
        self.thread = threading.Thread(target=self._infer, args=(way.model, request_id, inputs),
                                       daemon=True)
        self.thread.start()

    def _infer(self, model: str, request_id: str, inputs: Inputs) -> None:
        try:
            self.client.infer(model, client_inputs(inputs), request_id=request_id,
                              client_timeout=self.deadline_s)
        except InferenceServerException as exc:
            self.error = exc

    def leave(self) -> float:
        return self.sent_at + self.deadline_s

    def check_client(self) -> None:
        self.thread.join(JOIN_S)
        assert self.error is not None and self.error.status() == "StatusCode.DEADLINE_EXCEEDED"

    def close(self) -> None:
        self.thread.join(JOIN_S)
        self.client.close()


class ClientStreamSent(Sent):
    """tritonclient's stream, left with stop_stream(cancel_requests=True)."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(lambda result, error: self.results.put((result, error)))
        self.client.async_stream_infer(way.model, client_inputs(inputs), request_id=request_id)

    def leave(self) -> float:
        left_at = time.monotonic()
        self.client.stop_stream(cancel_requests=True)
        return left_at

    def check_client(self) -> None:
        assert all(result is None for result, _ in list(self.results.queue))

    def close(self) -> None:
        self.client.close()


class AioSent(Sent):
    """A tritonclient.aio call on an event loop of its own thread; leaving cancels it there."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        self.url, self.model, self.request_id, self.inputs = (server.grpc_url, way.model,
                                                              request_id, inputs)
        self.ready = threading.Event()
        self.outcome: BaseException | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self.ready.wait(JOIN_S)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.leaving = asyncio.Event()
        async with aioclient.InferenceServerClient(self.url) as client:
            await self.run(client)

    async def run(self, client: aioclient.InferenceServerClient) -> None:
        raise NotImplementedError

    def leave(self) -> float:
        left_at = time.monotonic()
        self.loop.call_soon_threadsafe(self.leaving.set)
        return left_at

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has already finished
            self.loop.call_soon_threadsafe(self.leaving.set)
        self.thread.join(JOIN_S)


class AioUnarySent(AioSent):
    """The aio client's infer as a task; leaving cancels the task."""

    async def run(self, client: aioclient.InferenceServerClient) -> None:
        task = asyncio.ensure_future(
            client.infer(self.model, client_inputs(self.inputs), request_id=self.request_id))
        self.ready.set()
        await self.leaving.wait()
        task.cancel()
        try:
            await task
        except BaseException as exc:  # what the client saw is the outcome
            self.outcome = exc

    def check_client(self) -> None:
        self.thread.join(JOIN_S)
        assert isinstance(self.outcome, asyncio.CancelledError), self.outcome


class AioStreamSent(AioSent):
    """The aio client's stream_infer, kept open; leaving cancels the response iterator."""

    async def run(self, client: aioclient.InferenceServerClient) -> None:
        release = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self.model, "inputs": client_inputs(self.inputs),
                   "request_id": self.request_id}
            await release.wait()  # keep the stream open until it is cancelled

        responses = client.stream_infer(requests())
        reader = asyncio.ensure_future(anext(aiter(responses), None))
        self.ready.set()
        await self.leaving.wait()
        responses.cancel()
        try:
            await reader
        except BaseException as exc:  # what the client saw is the outcome
            self.outcome = exc
        release.set()

    def check_client(self) -> None:
        self.thread.join(JOIN_S)
        assert isinstance(self.outcome, (asyncio.CancelledError, InferenceServerException)), \
            self.outcome


def stub_ways(cells: list[tuple[str, str]] = CELLS,
              hows: tuple[str, ...] = ("cancel", "deadline", "killed")) -> list[Way]:
    def way(route: str, model: str, how: str) -> Way:
        if how == "deadline":
            return Way("grpc", route, model, how, "DEADLINE", StubSent, deadline_s=DEADLINE_S)
        if how == "killed":
            return Way("grpc", route, model, how, "CLIENT_DISCONNECTED", KilledSent)
        return Way("grpc", route, model, how, "CLIENT_CANCELLED", StubSent, finishable=True)
    return [way(route, model, how) for route, model in cells for how in hows]


# tritonclient's own ways; the streams use slow_pair, whose two instances the stream shares.
CLIENT_WAYS = [
    Way("grpc", "unary", "slow", "tritonclient-cancel", "CLIENT_CANCELLED", ClientUnarySent,
        finishable=True),
    Way("grpc", "unary", "slow", "tritonclient-aio-cancel", "CLIENT_CANCELLED", AioUnarySent),
    Way("grpc", "unary", "slow", "tritonclient-timeout", "DEADLINE", ClientTimeoutSent,
        deadline_s=DEADLINE_S),
    Way("grpc", "stream", "slow_pair", "tritonclient-stop-stream", "CLIENT_CANCELLED",
        ClientStreamSent),
    Way("grpc", "stream", "slow_pair", "tritonclient-aio-cancel", "CLIENT_CANCELLED",
        AioStreamSent),
]


def ways() -> list[Way]:
    return stub_ways() + CLIENT_WAYS
