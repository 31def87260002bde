"""Calls from an instance process into the server (execution/process/calls.py), through an
in-process fake link: the model runs on a worker thread with the child's proxies
installed, the handlers on the test's event loop (the "server loop"), and every buffer is
copied on the way, as it would be crossing processes."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import msgspec.structs
import numpy as np
import pytest

from tests.unit.test_python_backend import (
    WAIT_S,
    admit_all,
    collect,
    fp32_request,
    make_backend,
    single_error,
    start,
    write_model,
)
from tests.unit.test_python_bls import (
    ASYNC_DECOUPLED_PARENT_MODEL,
    ASYNC_PARENT_MODEL,
    PARENT_MODEL,
    FakeService,
    parent_request,
)
from tritium.backends.python import metric, pb_utils, scope
from tritium.backends.python.metric import Bucket
from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.types import DataType, Tensor
from tritium.execution.process import bls, calls, codec, control, logger, metrics, wire
from tritium.execution.process.calls import CallReply
from tritium.execution.process.messages import BlsRequest, BlsResponse, ErrorBody, LogRecordBody
from tritium.execution.process.remote import RemoteLink

Reply = CallReply
BLS_REFUSED = "BLS is only supported during the 'execute' function."


class FakeCall:
    """channel.Call's shape over a deque the server loop fills."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.context: FakeContext | None = None
        self.cancelled = threading.Event()
        self._ready = threading.Condition()
        self._items: collections.deque[Reply | BaseException] = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, item: Reply | BaseException) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_settle, future)

    def _take(self) -> Reply:
        with self._ready:
            assert self._ready.wait_for(lambda: self._items, WAIT_S), "no reply came"
            item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def replies(self) -> Iterator[Reply]:
        while True:
            item = self._take()
            yield item
            if item.final:
                return

    def result(self) -> Reply:
        for reply in self.replies():
            if reply.final:
                return reply
        raise AssertionError("unreachable")

    async def async_replies(self) -> AsyncIterator[Reply]:
        loop = asyncio.get_running_loop()
        while True:
            with self._ready:
                waiter = None
                if not self._items:
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            if waiter is not None:
                await asyncio.wait_for(waiter, WAIT_S)
                continue
            item = self._take()
            yield item
            if item.final:
                return

    async def async_result(self) -> Reply:
        async for reply in self.async_replies():
            if reply.final:
                return reply
        raise AssertionError("unreachable")

    def cancel(self) -> None:
        self.cancelled.set()
        assert self.context is not None
        self.loop.call_soon_threadsafe(self.context.cancellation.cancel,
                                       CancelReason.CLIENT_CANCELLED)


def _crossed(payload: object) -> Any:
    """``payload`` as the other process reads it: through the channel's codec."""
    return codec.unpack_value(codec.pack_value(payload))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class FakeContext:
    def __init__(self, service: Any, call: FakeCall, parents: Sequence[AdmittedRequest]):
        self.instance = SimpleNamespace(service=service)
        self.parents = parents
        self.cancellation = Cancellation(service.loop)
        self._call = call

    def reply(self, payload: object, buffers: Sequence[memoryview] = (),
              final: bool = False) -> None:
        copies = [memoryview(bytearray(buffer)) for buffer in buffers]  # another process
        self._call.put(CallReply(_crossed(payload), copies, final))


class FakeLink:
    """The child's link: each call runs its handler on the server loop. As the real link
    sends the slots of the running execute, the parents come from the caller's scope."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.kinds: list[str] = []

    def call(self, kind: str, payload: object, buffers: Sequence[memoryview] = ()) -> FakeCall:
        self.kinds.append(kind)
        call = FakeCall(self.service.loop)
        context = call.context = FakeContext(self.service, call, list(scope.current_parents()))
        copies = [memoryview(bytes(buffer)) for buffer in buffers]
        asyncio.run_coroutine_threadsafe(self._run(kind, context, call, _crossed(payload),
                                                   copies),
                                         self.service.loop)
        return call

    async def _run(self, kind: str, context: FakeContext, call: FakeCall, payload: object,
                   buffers: list[memoryview]) -> None:
        try:
            await calls.HANDLERS[kind](context, payload, buffers)
        except Exception as exc:
            call.put(ErrorBody.of(exc).error())  # as the call's error crosses


@pytest.fixture
def linked() -> Iterator[list[FakeLink]]:
    """A remote server link for model code (BLS, metrics, model control) over the FakeLink the test
    puts in the list once its loop runs."""
    links: list[FakeLink] = []

    class Deferred:
        def call(self, kind: str, payload: object, buffers: Sequence[memoryview] = ()) -> Any:
            return links[0].call(kind, payload, buffers)

    saved = scope.current_link()
    scope.register_link(RemoteLink(Deferred()))
    try:
        yield links
    finally:
        scope.register_link(saved)


def run_child_parent(tmp_path: Path, links: list[FakeLink], source: str,
                     request: InferenceRequest) -> tuple[Any, FakeService, FakeLink,
                                                         list[InferenceResponse]]:
    """Run ``source`` as an instance process would (no service of its own) on one request."""
    async def main() -> tuple[Any, FakeService, FakeLink, list[InferenceResponse]]:
        service = FakeService(asyncio.get_running_loop())
        link = FakeLink(service)
        links.append(link)
        backend = make_backend(write_model(tmp_path, "parent", source), None)
        service.parents = admit_all([request])
        await start(backend, service.parents)
        return backend, service, link, await collect(service.parents[0].stream)

    return asyncio.run(main())


# -- wire ------------------------------------------------------------------------------


def every_datatype() -> list[Tensor]:
    tensors = []
    for datatype in DataType:
        if datatype is DataType.BYTES:
            data = np.array([[b"a", b""], [b"\x00z", "\u00e9".encode()]], dtype=object)
        elif datatype is DataType.BF16:
            data = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16).view(np.uint16)
        else:
            data = np.arange(4).astype(datatype.numpy).reshape(2, 2)
        tensors.append(Tensor(datatype.wire, datatype, data.shape, data))
    tensors.append(Tensor("EMPTY", DataType.FP32, (0, 3), np.zeros((0, 3), np.float32)))
    return tensors


def test_every_datatype_round_trips_as_buffers() -> None:
    tensors = every_datatype()
    headers, buffers = wire.encode_tensors(tensors)
    assert all(isinstance(buffer, memoryview) for buffer in buffers)
    decoded = wire.decode_tensors(headers, [memoryview(bytes(b)) for b in buffers])
    for sent, received in zip(tensors, decoded, strict=True):
        assert (received.name, received.datatype, received.shape) == \
            (sent.name, sent.datatype, sent.shape)
        assert received.data.tolist() == sent.data.tolist()


def test_fixed_size_tensors_are_views_not_copies() -> None:
    data = np.arange(6, dtype=np.int64)
    headers, buffers = wire.encode_tensors([Tensor("X", DataType.INT64, (6,), data)])
    assert np.shares_memory(np.frombuffer(buffers[0], np.uint8), data), "sent without a copy"
    received = bytearray(buffers[0])
    [tensor] = wire.decode_tensors(headers, [memoryview(received)])
    assert np.shares_memory(tensor.data, np.frombuffer(received, np.uint8)), "read in place"


def test_request_and_response_round_trip() -> None:
    request = fp32_request([1.0, 2.0], outputs=["OUT"])
    request.id, request.correlation_id, request.flags = "r1", "seq-7", 3
    request.parameters, request.timeout_us, request.model_version = {"k": 1}, 250, 2
    payload, buffers = wire.encode_request(request)
    back = wire.decode_request(codec.convert(BlsRequest, _crossed(payload)), buffers)
    assert (back.id, back.correlation_id, back.flags, back.parameters, back.timeout_us,
            back.model_version) == ("r1", "seq-7", 3, {"k": 1}, 250, 2)
    assert back.requested_output_names() == ["OUT"]
    assert back.inputs["INPUT0"].data.tolist() == [1.0, 2.0]
    failure = InferenceResponse.failure(TritiumError(ErrorCode.NOT_FOUND, "gone"), final=False)
    answer, buffers = wire.encode_response(failure)
    decoded = wire.decode_response(_crossed(answer), buffers)
    assert decoded.error is not None and decoded.error.code is ErrorCode.NOT_FOUND
    assert (decoded.error.message, decoded.final) == ("gone", False)


def test_every_call_kind_has_a_handler() -> None:
    assert {bls.EXEC, bls.STREAM, metrics.FAMILY, metrics.SERIES, metrics.UPDATE,
            metrics.SNAPSHOT, logger.LOG, control.LOAD, control.UNLOAD, control.READY} \
        == set(calls.HANDLERS)


# -- BLS -------------------------------------------------------------------------------


def test_exec_runs_the_child_in_the_server(tmp_path: Path, linked: list[FakeLink]) -> None:
    request = parent_request(target="echo", timeout=250)
    _, service, link, responses = run_child_parent(tmp_path, linked, PARENT_MODEL, request)
    assert responses[0].error is None
    np.testing.assert_array_equal(responses[0].outputs[0].data, [1.0, 2.0])
    assert link.kinds == [bls.EXEC]
    [admitted] = service.children
    child = admitted.request
    assert (child.model_name, child.timeout_us, child.parameters) == \
        ("echo", 250, {"from": "parent"})
    assert child.requested_output_names() == ["OUT"]


def test_exec_error_comes_back_in_the_response(tmp_path: Path, linked: list[FakeLink]) -> None:
    request = parent_request(target="missing")
    _, _, _, responses = run_child_parent(tmp_path, linked, PARENT_MODEL, request)
    error = single_error(responses)
    assert error.code is ErrorCode.NOT_FOUND and "missing" in error.message


def test_exec_of_decoupled_model_needs_decoupled_flag(tmp_path: Path,
                                                      linked: list[FakeLink]) -> None:
    request = parent_request(target="decoupled_three")
    _, _, _, responses = run_child_parent(tmp_path, linked, PARENT_MODEL, request)
    assert "decoupled=True" in single_error(responses).message


def test_decoupled_iterator_streams_and_ends_with_empty_final(
        tmp_path: Path, linked: list[FakeLink]) -> None:
    request = parent_request(target="decoupled_three", mode="iterate")
    backend, _, link, responses = run_child_parent(tmp_path, linked, PARENT_MODEL, request)
    assert responses[0].error is None
    assert backend.model.sizes == [1, 1, 0]
    assert link.kinds == [bls.STREAM]


def test_iterator_cancel_cancels_the_child(tmp_path: Path, linked: list[FakeLink]) -> None:
    request = parent_request(target="hang", mode="iterate", cancel=True)
    backend, service, _, responses = run_child_parent(tmp_path, linked, PARENT_MODEL, request)
    assert service.children[0].cancellation.reason is CancelReason.CLIENT_CANCELLED
    assert single_error(responses).code is ErrorCode.CANCELLED
    assert backend.model.sizes == [0]


def test_parent_cancel_reaches_the_blocked_child(tmp_path: Path,
                                                 linked: list[FakeLink]) -> None:
    async def main() -> list[InferenceResponse]:
        service = FakeService(asyncio.get_running_loop())
        linked.append(FakeLink(service))
        backend = make_backend(write_model(tmp_path, "parent", PARENT_MODEL), None)
        [parent] = admit_all([parent_request(target="hang")])
        running = asyncio.ensure_future(start(backend, [parent]))
        async with asyncio.timeout(WAIT_S):
            await service.submitted.wait()
        parent.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        async with asyncio.timeout(WAIT_S):
            await running
        assert service.children[0].cancellation.reason is CancelReason.PARENT_CANCELLED
        return await collect(parent.stream)

    error = single_error(asyncio.run(main()))
    assert error.code is ErrorCode.CANCELLED and "parent" in error.message


def test_async_exec_from_async_execute(tmp_path: Path, linked: list[FakeLink]) -> None:
    _, service, link, responses = run_child_parent(tmp_path, linked, ASYNC_PARENT_MODEL,
                                                   fp32_request([1.0, 2.0]))
    np.testing.assert_array_equal(responses[0].outputs[0].data, [2.0, 4.0])
    assert link.kinds == [bls.EXEC, bls.EXEC]
    assert len(service.children) == 2


def test_async_decoupled_exec_awaits_the_first_response(tmp_path: Path,
                                                        linked: list[FakeLink]) -> None:
    backend, _, _, responses = run_child_parent(tmp_path, linked, ASYNC_DECOUPLED_PARENT_MODEL,
                                                fp32_request([1.0, 2.0]))
    assert responses[0].error is None
    assert backend.model.done_at_once is False
    assert backend.model.sizes == [1, 1, 0]
    assert backend.model.replayed == [1, 1, 0]


def test_cancelling_the_async_exec_future_cancels_the_child(linked: list[FakeLink]) -> None:
    async def main() -> FakeService:
        service = FakeService(asyncio.get_running_loop())
        linked.append(FakeLink(service))
        await asyncio.get_running_loop().run_in_executor(None, _cancel_on_own_loop)
        return service

    service = asyncio.run(main())
    assert service.children[0].cancellation.reason is CancelReason.CLIENT_CANCELLED


def _cancel_on_own_loop() -> None:
    async def model_code() -> None:
        data = pb_utils.Tensor("INPUT0", np.array([1.0], dtype=np.float32))
        future = pb_utils.InferenceRequest(model_name="hang", inputs=[data],
                                           requested_output_names=[]).async_exec()
        await asyncio.sleep(0)  # the call is on its way
        future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await future

    asyncio.run(model_code())


def test_bls_outside_execute_is_refused_before_any_call(linked: list[FakeLink]) -> None:
    """Triton's stub: "BLS is only supported during the 'execute' function." """
    request = pb_utils.InferenceRequest(model_name="echo", requested_output_names=[],
                                        inputs=[pb_utils.Tensor("X", np.zeros(1, np.float32))])
    for phase in (scope.Phase.INITIALIZE, scope.Phase.FINALIZE):
        token = scope.enter(scope.ExecutionScope(None, "/m", phase=phase))
        try:
            with pytest.raises(pb_utils.TritonModelException,
                               match=re.escape(BLS_REFUSED)):
                request.exec()
            with pytest.raises(pb_utils.TritonModelException, match="only supported"):
                request.exec(decoupled=True)
        finally:
            scope.leave(token)
    assert linked == [], "nothing reached the link"


# -- metrics ---------------------------------------------------------------------------


def on_server(linked: list[FakeLink], model_code: Any) -> Any:
    """Run ``model_code()`` on a worker thread while the test's loop serves its calls."""
    async def main() -> Any:
        linked.append(FakeLink(FakeService(asyncio.get_running_loop())))
        return await asyncio.get_running_loop().run_in_executor(None, model_code)

    return asyncio.run(main())


def test_families_and_series_live_in_the_server_registry(linked: list[FakeLink]) -> None:
    def model_code() -> tuple[float, float, Any]:
        family = pb_utils.MetricFamily("bridge_requests", "Requests seen",
                                       pb_utils.MetricFamily.COUNTER)
        first = family.Metric(labels={"b": "2", "a": "1"})
        first.increment(2)
        second = family.Metric(labels={"a": "1", "b": "2"})  # the same series
        second.increment(0.5)
        gauge = pb_utils.MetricFamily("bridge_level", "Level", pb_utils.MetricFamily.GAUGE)
        level = gauge.Metric()
        level.set(7.25)
        sizes = pb_utils.MetricFamily("bridge_sizes", "Sizes", pb_utils.MetricFamily.HISTOGRAM)
        histogram = sizes.Metric(buckets=[1.0, 10.0])
        histogram.observe(5.0)
        return first.value(), level.value(), histogram.snapshot()

    counted, level, sizes = on_server(linked, model_code)
    assert (counted, level) == (2.5, 7.25)
    assert sizes.count == 1
    assert sizes.buckets == (Bucket(1.0, 0), Bucket(10.0, 1), Bucket(float("inf"), 1))
    exported = {family.name: family for family in metric.MetricFamily.snapshots()}
    [series] = exported["bridge_requests"].series
    assert (series.labels, series.value) == ({"a": "1", "b": "2"}, 2.5)
    assert exported["bridge_level"].series[0].value == 7.25


def test_metric_refusals_keep_triton_texts(linked: list[FakeLink]) -> None:
    def model_code() -> list[str]:
        texts = []
        pb_utils.MetricFamily("bridge_kind", "x", pb_utils.MetricFamily.COUNTER)
        try:
            pb_utils.MetricFamily("bridge_kind", "x", pb_utils.MetricFamily.GAUGE)
        except pb_utils.TritonModelException as exc:
            texts.append(str(exc))
        counter = pb_utils.MetricFamily("bridge_kind", "x", pb_utils.MetricFamily.COUNTER)
        try:
            counter.Metric().increment(-1)
        except pb_utils.TritonModelException as exc:
            texts.append(str(exc))
        return texts

    texts = on_server(linked, model_code)
    assert texts[0] == ("Error when creating MetricFamily: Family name already exists with "
                        "different type")
    assert texts[1].startswith("Failed to increment metric value: ")


# -- model control ---------------------------------------------------------------------


class ControlService(FakeService):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.loaded: list[tuple[str, Any]] = []
        self.unloaded: list[str] = []

    async def load_model(self, name: str, parameters: Any) -> None:
        if name == "broken":
            raise TritiumError(ErrorCode.INVALID_ARG, "load failed for model 'broken'")
        self.loaded.append((name, dict(parameters)))

    async def unload_model(self, name: str, parameters: Any) -> None:
        self.unloaded.append(name)

    def model(self, name: str, version: int | None = None) -> Any:
        if name == "unknown":
            raise TritiumError(ErrorCode.NOT_FOUND, "Request for unknown model: 'unknown'")
        return SimpleNamespace(is_ready=lambda: version != 9, decoupled=False)


def test_model_control_runs_in_the_server(linked: list[FakeLink]) -> None:
    def model_code() -> list[Any]:
        results: list[Any] = []
        pb_utils.load_model("target", config='{"max_batch_size": 2}', files={"f": b"x"})
        pb_utils.unload_model("target")
        results.append(pb_utils.is_model_ready("target"))
        results.append(pb_utils.is_model_ready("target", "9"))
        for call in (lambda: pb_utils.load_model("broken"),
                     lambda: pb_utils.is_model_ready("unknown")):
            try:
                call()
            except pb_utils.TritonModelException as exc:
                results.append(str(exc))
        return results

    async def main() -> tuple[ControlService, list[Any]]:
        service = ControlService(asyncio.get_running_loop())
        linked.append(FakeLink(service))
        return service, await asyncio.get_running_loop().run_in_executor(None, model_code)

    service, results = asyncio.run(main())
    assert service.loaded == [("target", {"config": '{"max_batch_size": 2}', "f": b"x"})]
    assert service.unloaded == ["target"]
    assert results == [True, False, "Failed to load model: load failed for model 'broken'",
                       "Failed to check model readiness: Request for unknown model: 'unknown'"]


def test_model_control_is_refused_in_finalize_before_any_call(linked: list[FakeLink]) -> None:
    token = scope.enter(scope.ExecutionScope(None, "/m", phase=scope.Phase.FINALIZE))
    try:
        with pytest.raises(pb_utils.TritonModelException, match="not supported during"):
            pb_utils.load_model("target")
    finally:
        scope.leave(token)
    assert linked == []


# -- logging ---------------------------------------------------------------------------


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_forwarded_records_keep_name_level_and_text() -> None:
    target = logging.getLogger("tritium.test_process_calls")
    captured = Captured()
    target.addHandler(captured)
    target.setLevel(logging.INFO)
    sent: list[Any] = []
    link = SimpleNamespace(call=lambda kind, payload, buffers=(): sent.append((kind, payload)))
    source = logging.getLogger("child.tritium.test_process_calls")
    source.propagate = False
    source.addHandler(logger.ForwardingHandler(link))
    source.setLevel(logging.DEBUG)
    try:
        source.warning("%d tokens for %s", 3, "x")
        source.debug("verbose only")
        try:
            raise ValueError("boom")
        except ValueError:
            source.exception("failed")
        for kind, body in sent:
            assert kind == logger.LOG
            # As it crossed, and as if the child had logged under the same name.
            crossed = codec.convert(LogRecordBody, _crossed(body))
            logger.emit(msgspec.structs.replace(crossed, name=target.name))
    finally:
        target.removeHandler(captured)
    formatted = [logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)
                 for record in captured.records]
    assert len(sent) == 3, "the child forwards every level"
    assert formatted[0] == "WARNING tritium.test_process_calls: 3 tokens for x"
    assert len(captured.records) == 2, "DEBUG is dropped by the server logger's level"
    assert formatted[1].startswith("ERROR tritium.test_process_calls: failed\nTraceback")
    assert "ValueError: boom" in formatted[1]


def test_instance_gone_ends_its_bls_children() -> None:
    """The instance process died (its calls are cancelled, not by the caller): nobody will
    read the child's responses, so its stream ends at once instead of running on."""
    async def main() -> tuple[FakeService, list[Reply]]:
        service = FakeService(asyncio.get_running_loop())
        call = FakeCall(service.loop)
        context = call.context = FakeContext(service, call, [])
        payload, buffers = wire.encode_request(fp32_request([1.0]))
        payload = msgspec.structs.replace(payload, model_name="hang")
        serving = asyncio.ensure_future(bls.serve_stream(context, payload, list(buffers)))
        async with asyncio.timeout(WAIT_S):
            await service.submitted.wait()
        context.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        async with asyncio.timeout(WAIT_S):
            await serving
        return service, list(call.replies())

    service, replies = asyncio.run(main())
    assert service.children[0].cancellation.reason is CancelReason.PARENT_CANCELLED
    [reply] = replies
    response: BlsResponse = codec.convert(BlsResponse, reply.payload)  # as it crossed
    assert reply.final and response.error is not None and response.error.code == "CANCELLED"
