"""PythonBackend: runs one instance of a model.py's TritonPythonModel for the core."""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import types
from collections.abc import Awaitable, Coroutine
from typing import Any

from tritium.backends.python import scope
from tritium.backends.python.errors import TritonModelException, describe_exception
from tritium.backends.python.importer import forget_module
from tritium.backends.python.link import ServerLink
from tritium.backends.python.request import ReceivedRequest, RequestContext
from tritium.backends.python.response import InferenceResponse
from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import InferenceResponse as CoreResponse
from tritium.core.response import StreamClosedError
from tritium.core.tracing import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    TENSOR_BACKEND_OUTPUT,
    RequestTrace,
    record,
    traces_of,
)

log = logging.getLogger("tritium.backends.python")


class PythonBackend:
    """A ``tritium.execution.backend.ModelBackend`` for one TritonPythonModel instance.

    ``execute`` never raises: whatever goes wrong in model code becomes an error
    response for each request of that call that has not finished yet.
    """

    def __init__(
        self,
        model: Any,
        model_name: str,
        model_dir: str,
        link: ServerLink | None,
        context: RequestContext,
        module: types.ModuleType | None = None,
        instance_name: str | None = None,
    ) -> None:
        self.model = model
        self.model_name = model_name
        # Triton's stub is named after the instance: its error texts name that.
        self.instance_name = instance_name or model_name
        self.model_dir = model_dir
        self.decoupled = context.decoupled
        self.is_async = inspect.iscoroutinefunction(getattr(model, "execute", None))
        self._link = link
        self._context = context
        self._module = module

    def execute(self, requests: list[AdmittedRequest]) -> Awaitable[None] | None:
        context = self._context
        received = []
        # One loop, not traces_of() and a comprehension (a call each before Python 3.12).
        for admitted in requests:
            if admitted.request.trace is not None:
                return self._traced_execute(requests, traces_of(requests) or [])
            received.append(ReceivedRequest(admitted, context))
        return self._run(requests, received)

    def _traced_execute(self, requests: list[AdmittedRequest], traces: list[RequestTrace]
                        ) -> Awaitable[None] | None:
        """``execute`` with Triton's compute timestamps on the traced requests: inputs are
        ready once the model's request objects are made, outputs start when it returns."""
        record(traces, COMPUTE_START, time.monotonic_ns())
        context = self._context
        received = [ReceivedRequest(request, context) for request in requests]
        record(traces, COMPUTE_INPUT_END, time.monotonic_ns())
        return self._run(requests, received, traces)

    def _run(self, requests: list[AdmittedRequest], received: list[ReceivedRequest],
             traces: list[RequestTrace] | None = None) -> Awaitable[None] | None:
        """Call the model's ``execute``; an ``async def`` one returns what completes it."""
        # Inside the scope, what the model sends itself reaches its client now, not when
        # execute returns (core.response.model_scope); what follows it is held back.
        token = scope.enter(scope.ExecutionScope(self._link, self.model_dir, requests))
        try:
            try:
                result = self.model.execute(received)
            finally:
                scope.leave(token)
        except Exception as exc:
            self._fail(received, describe_exception(exc), exc)
            if traces is not None:
                record(traces, COMPUTE_END, time.monotonic_ns())
            return None
        # A list, the usual return, is told apart without inspect's Python-level call.
        if type(result) is not list and inspect.iscoroutine(result):
            return self._complete_async(requests, received, result, traces)
        self._returned(requests, received, result, traces)
        return None

    def finalize(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        token = scope.enter(scope.ExecutionScope(self._link, self.model_dir,
                                                 phase=scope.Phase.FINALIZE))
        try:
            if finalize is not None:
                finalize()
        except Exception:
            log.exception("finalize() of model '%s' failed", self.model_name)
        finally:
            scope.leave(token)
            if self._module is not None:
                forget_module(self._module)

    async def _complete_async(
        self,
        requests: list[AdmittedRequest],
        received: list[ReceivedRequest],
        coroutine: Coroutine[Any, Any, Any],
        traces: list[RequestTrace] | None = None,
    ) -> None:
        # Entered here, inside the task that runs the coroutine, so that BLS calls made by
        # the coroutine (and tasks it starts) see these requests as their parents.
        token = scope.enter(scope.ExecutionScope(self._link, self.model_dir, requests))
        try:
            result = await coroutine
        except Exception as exc:
            self._fail(received, describe_exception(exc), exc)
            if traces is not None:
                record(traces, COMPUTE_END, time.monotonic_ns())
            return
        finally:
            scope.leave(token)
        self._returned(requests, received, result, traces)

    # -- after the model returned ------------------------------------------------
    def _returned(self, requests: list[AdmittedRequest], received: list[ReceivedRequest],
                  result: Any, traces: list[RequestTrace] | None) -> None:
        if traces is None:
            self._deliver(received, result)
            return
        record(traces, COMPUTE_OUTPUT_START, time.monotonic_ns())
        _trace_outputs(requests, result)
        self._deliver(received, result)
        record(traces, COMPUTE_END, time.monotonic_ns())

    def _deliver(self, received: list[ReceivedRequest], result: Any) -> None:
        if self.decoupled:
            if result is not None:
                self._fail(received,
                           messages.PY_DECOUPLED_RETURN.format(instance=self.instance_name))
                return
            for request in received:
                if request.rescheduled() and not request.may_reschedule():
                    self._refuse_reschedule(request)
            return
        if result is None:
            # Triton lets a non-decoupled model answer every request through its sender.
            result = [None] * len(received)
        problem = _returned_problem(received, result)
        if problem is not None:
            self._fail(received, problem)
            return
        # Of one length (checked just above): zip's ``strict`` keyword would cost a C
        # argument parse, about a microsecond, on every batch.
        for request, response in zip(received, result):  # noqa: B905
            self._finish(request, response)

    def _finish(self, request: ReceivedRequest, response: InferenceResponse | None) -> None:
        if response is not None:  # not rescheduled: _returned_problem refuses that
            try:
                request.finish(response)
            except (TritonModelException, TritiumError) as exc:
                # Only a model thread racing this one on the same sender gets here.
                log.error("model '%s': response not sent: %s", self.model_name, exc)
            return
        if request.rescheduled():
            # Its response comes from a later execute, once the scheduler runs it again.
            if not request.may_reschedule():
                self._refuse_reschedule(request)
            return
        sender = request.get_response_sender()
        if sender.responses_sent > 0:
            sender.close_with(CoreResponse.final_flag())
        else:
            # The response may still come from another thread or task, as in Triton.
            sender.fail_when_abandoned(
                f"model '{self.model_name}' returned None for a request and let go of it "
                "without sending its response through the response sender"
            )

    def _refuse_reschedule(self, request: ReceivedRequest) -> None:
        """Triton's core refuses the release and the python backend releases the request
        with ALL instead, logging "Failed to release request"; nothing more can answer
        it, so the client gets the refusal rather than waiting forever."""
        request.keep_flags()
        log.error("model '%s': Failed to release request: %s", self.model_name,
                  messages.RESCHEDULE_NOT_CONFIGURED)
        error = TritiumError(ErrorCode.INTERNAL, messages.RESCHEDULE_NOT_CONFIGURED)
        with contextlib.suppress(StreamClosedError):  # its model ended it already
            request.get_response_sender().close_with(CoreResponse.failure(error))

    def _fail(
        self, received: list[ReceivedRequest], message: str, exc: BaseException | None = None
    ) -> None:
        text = messages.PY_EXECUTE_FAILED.format(instance=self.instance_name, reason=message)
        log.error("%s", text, exc_info=exc)
        failure = CoreResponse.failure(TritiumError(ErrorCode.INTERNAL, text))
        for request in received:
            request.keep_flags()  # a failed execute reschedules nothing, as in Triton
            # Closing every sender also stops a model thread from sending after this.
            request.get_response_sender().close_with(failure)


def _returned_problem(received: list[ReceivedRequest], result: Any) -> str | None:
    """Why ``result`` is not an acceptable non-decoupled return value, if it is not."""
    if not isinstance(result, list):
        return f"Expected a list in the execute return, found type '{type(result)}'."
    if len(result) != len(received):
        return (
            "Number of InferenceResponse objects do not match the number of "
            f"InferenceRequest objects. InferenceRequest(s) size is:{len(received)}, and "
            f"InferenceResponse(s) size is:{len(result)}\n"
        )
    for request, response in zip(received, result):  # noqa: B905 (one length: see _deliver)
        if response is None:
            continue
        if request.rescheduled():
            return messages.PY_RESCHEDULED_RESPONSE.format(type=type(response))
        if not isinstance(response, InferenceResponse):
            return (
                "Expected an 'InferenceResponse' object in the execute function return "
                f"list, found type '{type(response)}'."
            )
        if request._sender is not None:
            try:
                request._sender.check_returned()
            except TritonModelException as exc:
                return str(exc)
    return None


def _trace_outputs(requests: list[AdmittedRequest], result: Any) -> None:
    """Level TENSORS: the outputs ``execute`` returned, each with its request's trace (a
    decoupled model's, sent through its response sender, are not recorded)."""
    if type(result) is not list or len(result) != len(requests):
        return
    for admitted, response in zip(requests, result, strict=True):
        trace = admitted.request.trace
        if trace is not None and isinstance(response, InferenceResponse):
            trace.tensors(TENSOR_BACKEND_OUTPUT, [t._core for t in response.output_tensors()])
