"""EnsembleRun: one ensemble request, its steps submitted as child requests of the core.

Runs on the server loop only. Each step is an ordinary request to its model through
``InferenceService.submit``, so it joins that model's queue (and dynamic batches) as a
client's request would. Every step's cancellation follows the run's own, which follows
the ensemble request's: when the client leaves, a queued step is dropped by its scheduler,
an executing one sees ``is_cancelled()``, and no further step is started.

A step's error, as in Triton's EnsembleContext, starts no further step and is answered once
the steps already running have finished (their outputs are dropped); a later step's error
replaces it. A client that leaves meanwhile still stops them at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestedOutput
from tritium.core.response import InferenceResponse, ResponseStream, StreamClosedError
from tritium.core.types import Tensor
from tritium.ensemble.graph import EnsembleGraph, StepRun, TensorBoard, TensorKey, reshape_dims
from tritium.ensemble.limits import StepLimits

if TYPE_CHECKING:
    from tritium.core.model import ModelHandle
    from tritium.core.service import InferenceService


@dataclass(slots=True)
class Slot:
    """A value of an ensemble tensor: None where the producer left an output out (an
    optional input of the next model, as in Triton); ``batch_size`` 0 when it was made
    without a batch dimension."""

    tensor: Tensor | None
    batch_size: int


@dataclass(slots=True)
class StepTimes:
    """What the ensemble's statistics take from its steps: their durations, summed."""

    compute_ns: int = 0


class EnsembleRun:
    def __init__(self, graph: EnsembleGraph, service: InferenceService,
                 request: AdmittedRequest, decoupled: bool, batching: bool,
                 outputs: dict[str, tuple[int, ...]], limits: StepLimits):
        self._graph = graph
        self._plan = graph.plan
        self._service = service
        self._request = request
        self._decoupled = decoupled
        self._batching = batching
        self._output_dims = outputs  # ensemble output -> its configured (reshaped) dims
        self._limits = limits  # the ensemble's, shared by its requests
        requested = request.request.requested_output_names()
        self._requested = tuple(name for name in self._plan.outputs
                                if requested is None or name in requested)
        self._board: TensorBoard[Slot] = TensorBoard(graph, self._requested)
        # The steps' parent: cancelled with the request's reason, or on its own when the
        # run fails (so that steps still running stop).
        self._steps_cancellation = Cancellation.following(service.loop, (request.cancellation,))
        self._in_flight = 0
        self._closed = False  # a final response (or the cancellation's error) was sent
        self._held: InferenceResponse | None = None
        self._error: TritiumError | None = None  # the run failed: answered once none runs
        self._tasks: set[asyncio.Task[None]] = set()
        self.times = StepTimes()

    # -- driven by EnsembleModel ---------------------------------------------------
    def start(self) -> None:
        """Write the ensemble's inputs and start the steps that can run.

        Called on the next turn of the loop, not inside ``enqueue``: an answer sent before
        the service has hooked the request's stream (a step refused at once) would never
        tell it the request finished."""
        if self._closed:
            return
        request = self._request
        batch = request.batch_size if self._batching else 0
        updated: list[TensorKey] = []
        for name in self._plan.inputs:
            tensor = request.request.inputs.get(name)
            # An optional input the client left out is a placeholder, so steps reading it
            # still run (without that input), as in Triton.
            updated.append(self._board.put(name, Slot(tensor, batch)))
        self._advance(updated)

    def cancel(self) -> None:
        """The ensemble request was cancelled: start nothing more."""
        self._closed = True
        reason = self._request.cancellation.reason or CancelReason.CLIENT_CANCELLED
        self._steps_cancellation.cancel(reason)
        self._stop_pumps()

    def finished(self) -> None:
        """The ensemble's final response was sent: let go of the request."""
        if not self._closed:
            self._closed = True
            self._steps_cancellation.cancel(CancelReason.PARENT_CANCELLED)
        self._steps_cancellation.detach()
        self._stop_pumps()

    def _stop_pumps(self) -> None:
        """Stop reading steps whose answers are no longer wanted: a step that was told to
        stop may take its time (or, decoupled, never send FINAL), and its reader must not
        keep this run alive meanwhile. The steps' streams still end on their own."""
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    # -- moving forward ---------------------------------------------------------------
    def _advance(self, updated: list[TensorKey]) -> None:
        """Start the steps ``updated`` made ready, answer for the outputs it completed,
        and end the request once no step is left running."""
        if self._closed:
            return
        if self._error is not None:
            self._answer_failure()
            return
        board = self._board
        for run in board.ready_steps(updated):
            self._launch(run)
            if self._closed or self._error is not None:
                self._answer_failure()
                return
        try:
            responses = [self._response(board.take_outputs(iteration))
                         for iteration in board.ready_outputs(updated)]
        except TritiumError as exc:
            self._fail(exc)
            return
        done = self._in_flight == 0
        if not self._decoupled:
            if responses:
                self._held = responses[-1]
            if done:
                self._finish_single()
            return
        for index, response in enumerate(responses):
            response.final = done and index == len(responses) - 1
            self._send(response)
        if done and not responses:
            self._send(InferenceResponse.final_flag())

    def _launch(self, run: StepRun) -> None:
        inputs = self._board.take_inputs(run)
        # Counted at once, so the request cannot end while the step waits for its turn.
        self._in_flight += 1
        self._limits.acquire(run.step, lambda: self._submit(run, inputs))

    def _submit(self, run: StepRun, inputs: dict[str, Slot]) -> bool:
        """Submit the step's request and read its responses; False if it was not sent."""
        if self._closed:
            return False
        if self._error is not None:  # failed while this step waited for its turn
            self._in_flight -= 1
            self._answer_failure()
            return False
        step = self._plan.steps[run.step]
        version = None if step.model_version < 0 else step.model_version
        cancellation = Cancellation.following(self._service.loop, (self._steps_cancellation,))
        try:
            model = self._service.member_model(step.model_key, version)
            child, batch = self._child_request(model, run, inputs)
            stream = self._service.submit(child, cancellation, allow_decoupled=True,
                                          internal=True, model=model)
        except TritiumError as exc:
            cancellation.detach()
            self._in_flight -= 1
            self._fail(exc)
            return False
        task = self._service.loop.create_task(self._pump(run, stream, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _child_request(self, model: ModelHandle, run: StepRun, inputs: dict[str, Slot]
                       ) -> tuple[InferenceRequest, int]:
        """The step's request (with the ensemble request's id, correlation, flags,
        priority, timeout and parameters, as Triton forwards them) and its batch size
        (0 when the step's model does not batch)."""
        parent = self._request.request
        batching = model.max_batch_size > 0
        tensors: dict[str, Tensor] = {}
        for name, slot in inputs.items():
            if slot.tensor is None:
                continue
            spec = model.inputs.get(name)
            dims = spec.dims if spec is not None else slot.tensor.shape
            shape = reshape_dims(dims, batching, slot.batch_size, slot.tensor.shape)
            data = slot.tensor.data if shape == slot.tensor.shape else \
                slot.tensor.data.reshape(shape)
            # A fresh Tensor: validation may reshape it, and other steps read the same value.
            tensors[name] = Tensor(name, slot.tensor.datatype, shape, data)
        batch = next((t.shape[0] for t in tensors.values() if t.shape), 1) if batching else 0
        step = self._plan.steps[run.step]
        child = InferenceRequest(
            model_name=step.model_name,
            inputs=tensors,
            model_version=None if step.model_version < 0 else step.model_version,
            id=parent.id,
            requested_outputs=[RequestedOutput(name) for name in step.output_map],
            parameters=dict(parent.parameters),
            correlation_id=parent.correlation_id,
            flags=parent.flags,
            priority=parent.priority,
            timeout_us=parent.timeout_us,
            trace=parent.trace,  # the ensemble's own: each step is its child
        )
        return child, batch

    async def _pump(self, run: StepRun, stream: ResponseStream, batch: int) -> None:
        """Feed each response of one step into the board, until its final one."""
        started = time.monotonic_ns()
        try:
            async for response in stream:
                if self._closed:
                    return  # the step was cancelled with the run; its answers are not wanted
                if response.final:
                    self._in_flight -= 1
                    self.times.compute_ns += time.monotonic_ns() - started
                if response.error is not None:
                    self._fail(response.error)
                elif self._error is not None:
                    self._answer_failure()  # a running step ended: the last one answers
                else:
                    self._advance([] if response.flag_only
                                  else self._store(run.step, response, batch))
        finally:
            self._limits.release(run.step)

    def _store(self, index: int, response: InferenceResponse, batch: int) -> list[TensorKey]:
        output_map = self._plan.steps[index].output_map
        produced = {tensor.name: tensor for tensor in response.outputs}
        updated = []
        for name, tensor_name in output_map.items():
            tensor = produced.get(name)
            value = None if tensor is None else Tensor(tensor_name, tensor.datatype,
                                                       tensor.shape, tensor.data)
            updated.append(self._board.put(tensor_name, Slot(value, batch)))
        return updated

    # -- answering ----------------------------------------------------------------------
    def _response(self, values: dict[str, Slot]) -> InferenceResponse:
        batching = self._batching
        outputs = []
        for name in self._requested:
            slot = values[name]
            if slot.tensor is None:
                continue  # no step wrote it this time; Triton leaves it out too
            tensor = slot.tensor
            shape = reshape_dims(self._output_dims[name], batching, slot.batch_size,
                                 tensor.shape)
            data = tensor.data if shape == tensor.shape else tensor.data.reshape(shape)
            outputs.append(Tensor(name, tensor.datatype, shape, data))
        return InferenceResponse(outputs=outputs, final=False)

    def _finish_single(self) -> None:
        held, self._held = self._held, None
        if held is None:
            self._fail(TritiumError(
                ErrorCode.INVALID_ARG,
                f"[request id: {self._request.describe()}] unexpected deadlock, at least one "
                "output is not set while no more ensemble steps can be made"))
            return
        held.final = True
        self._send(held)

    def _fail(self, error: TritiumError) -> None:
        """The run failed with ``error``: answered once no step is running."""
        if self._closed:
            return
        self._error = error
        self._answer_failure()

    def _answer_failure(self) -> None:
        """End the failed request with its error (named after the ensemble, as Triton words
        it) once its last running step has finished."""
        error = self._error
        if self._closed or error is None or self._in_flight:
            return
        self._send(InferenceResponse.failure(TritiumError(
            error.code, f"in ensemble '{self._plan.name}', {error.message}")))
        self._stop_pumps()

    def _send(self, response: InferenceResponse) -> None:
        if response.final:
            self._closed = True
        try:
            self._request.stream.send_nowait(response)
        except StreamClosedError:
            self._closed = True  # ended by a cancellation meanwhile: nobody is listening
