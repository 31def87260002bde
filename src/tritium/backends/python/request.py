"""pb_utils.InferenceRequest: built by a model for BLS, or wrapping a request it executes."""

from __future__ import annotations

import enum
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from tritium.backends.python import arguments, bls
from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.pb_tensor import Tensor
from tritium.backends.python.response import InferenceResponse, check_parameters, to_core
from tritium.backends.python.sender import InferenceResponseSender
from tritium.core import messages
from tritium.core.request import RELEASE_ALL, RELEASE_RESCHEDULE, SEQUENCE_END, AdmittedRequest

if TYPE_CHECKING:
    import asyncio

TRITONSERVER_REQUEST_RELEASE_ALL = RELEASE_ALL
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = RELEASE_RESCHEDULE


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


class PreferredMemory:
    """Where BLS outputs should live; tritium keeps every tensor on the CPU."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """The trace of a request a model executes (``request.trace()``): passed as the
    ``trace`` of a BLS request, it makes that request a child in the same trace."""

    __slots__ = ("_core",)

    def __init__(self, core: Any = None) -> None:
        self._core = core  # core.tracing.RequestTrace, or None when not traced

    def get_context(self) -> str | None:
        """The W3C trace context of the request's span as JSON (``{"traceparent": ...}``)
        in the opentelemetry mode; None otherwise."""
        return None if self._core is None else self._core.context()


def _correlation_id(value: object) -> int | str:
    """Triton's binding takes an int (as uint64) or a str, and says so for anything else."""
    if isinstance(value, str):
        return value
    if not isinstance(value, int):
        raise TritonModelException(messages.PB_CORRELATION_ID)
    if not 0 <= value < 1 << 64:
        # pybind11's cast to uint64_t fails with its (release build) RuntimeError.
        raise RuntimeError(messages.PB_CAST_FAILED)
    return int(value)


class InferenceRequest:
    """A BLS request. Argument order, defaults and checks are Triton's (arguments.py)."""

    __slots__ = (
        "_correlation_id",
        "_flags",
        "_inputs",
        "_model_name",
        "_model_version",
        "_parameters",
        "_request_id",
        "_requested_output_names",
        "_timeout",
        "_trace",
    )

    def __init__(
        self,
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: Sequence[str | bytes] | None = None,
        model_name: str | bytes | None = None,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        call = "InferenceRequest.__init__()"
        # pybind11 converts every argument (TypeError) before Triton's own checks run.
        if correlation_id is None:
            raise arguments.incompatible(call, "correlation_id", "int or str", None)
        self._request_id = arguments.text(call, "request_id", request_id)
        given = arguments.instances(call, "inputs", inputs, Tensor)
        names = arguments.text_list(call, "requested_output_names", requested_output_names)
        self._model_name = arguments.text(call, "model_name", model_name)
        self._model_version = arguments.integer(call, "model_version", model_version,
                                                arguments.INT64)
        self._flags = arguments.integer(call, "flags", flags, arguments.UINT32)
        self._timeout = arguments.integer(call, "timeout", timeout, arguments.UINT64)
        arguments.optional_instance(call, "preferred_memory", preferred_memory, PreferredMemory)
        self._trace = arguments.optional_instance(call, "trace", trace, InferenceTrace) \
            or InferenceTrace()
        self._parameters = check_parameters(parameters)
        self._correlation_id = _correlation_id(correlation_id)
        # A None input is an empty pointer to Triton's binding, refused by its constructor.
        if None in given:
            raise TritonModelException(self._described(messages.PB_EMPTY_REQUEST_INPUT))
        if "" in names:
            raise TritonModelException(self._described(messages.PB_EMPTY_REQUESTED_OUTPUT))
        self._inputs: list[Tensor] = given  # type: ignore[assignment]
        self._requested_output_names = list(dict.fromkeys(names))

    def _described(self, message: str) -> str:
        return message.format(request_id=self._request_id, model_name=self._model_name)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return orjson.dumps(self._parameters).decode()

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> InferenceResponseSender:
        raise TritonModelException("A BLS request has no response sender")

    def set_release_flags(self, flags: int) -> None:
        # Triton's binding stores the flags on any request; only an executed request is
        # ever released with them, so on a BLS request they do nothing.
        arguments.integer("InferenceRequest.set_release_flags()", "flags", flags,
                          arguments.UINT32)

    def exec(self, decoupled: bool = False) -> Any:
        """Run the request on the server; errors come back inside the response."""
        if decoupled:
            return bls.exec_decoupled(self)
        return bls.exec_blocking(self)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """Like ``exec``, awaitable from ``async def execute`` (submitted right away)."""
        if decoupled:
            return bls.exec_decoupled_async(self)
        return bls.exec_async(self)


class RequestContext:
    """What every request an instance executes shares: the model's outputs and policy."""

    __slots__ = ("decoupled", "iterative", "output_names", "sorted_output_names")

    def __init__(self, output_names: list[str], decoupled: bool, iterative: bool = False
                 ) -> None:
        self.output_names = frozenset(output_names)
        self.sorted_output_names = sorted(self.output_names)
        self.decoupled = decoupled
        # ``sequence_batching { iterative_sequence: true }``: requests may be rescheduled.
        self.iterative = iterative


class ReceivedRequest(InferenceRequest):
    """A request being executed: a thin view of the core request (hot path, no copies)."""

    __slots__ = ("_admitted", "_context", "_core", "_finished", "_input_list", "_sender")

    def __init__(self, admitted: AdmittedRequest, context: RequestContext) -> None:
        # Deliberately not calling InferenceRequest.__init__: nothing is copied up front.
        self._admitted = admitted
        self._core = admitted.request
        self._context = context
        self._input_list: list[Tensor] | None = None
        self._sender: InferenceResponseSender | None = None
        self._finished = False

    def inputs(self) -> list[Tensor]:
        if self._input_list is None:
            self._input_list = [Tensor._wrap(tensor) for tensor in self._core.inputs.values()]
        return self._input_list

    def input_tensor(self, name: str) -> Tensor | None:
        core = self._core.inputs.get(name)
        return None if core is None else Tensor._wrap(core)

    def request_id(self) -> str:
        return self._core.id

    def correlation_id(self) -> int | str:
        return self._core.correlation_id

    def flags(self) -> int:
        return self._core.flags

    def set_flags(self, flags: int) -> None:
        raise TritonModelException("The flags of a received request cannot be changed")

    def timeout(self) -> int:
        return self._core.timeout_us

    def parameters(self) -> str:
        return orjson.dumps(self._core.parameters).decode()

    def requested_output_names(self) -> list[str]:
        # Triton keeps them in a std::set, so the model sees them sorted.
        names = self._core.requested_output_names()
        return self._context.sorted_output_names if names is None else sorted(set(names))

    def model_name(self) -> str:
        return self._core.model_name

    def trace(self) -> InferenceTrace:
        return InferenceTrace(self._core.trace)

    def is_cancelled(self) -> bool:
        return self._admitted.cancellation.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(
                self._admitted, self.wanted_outputs(), self._context.decoupled
            )
            if self._finished:
                self._sender.mark_finished()
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """Read when ``execute`` returns: RESCHEDULE runs this request again later."""
        self._admitted.release_flags = arguments.integer(
            "InferenceRequest.set_release_flags()", "flags", flags, arguments.UINT32)

    def exec(self, decoupled: bool = False) -> Any:
        raise TritonModelException("Only requests created by the model can be executed")

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        raise TritonModelException("Only requests created by the model can be executed")

    # -- for the backend -------------------------------------------------------
    def rescheduled(self) -> bool:
        return self._admitted.release_flags == RELEASE_RESCHEDULE

    def may_reschedule(self) -> bool:
        """Whether the scheduler takes this request back: Triton's sequence batcher does for
        an iterative sequence, except for a request that carried the sequence's END."""
        return self._context.iterative and not self._core.flags & SEQUENCE_END

    def keep_flags(self) -> None:
        """Release with ALL, as Triton resets the flags of a request whose execute failed."""
        self._admitted.release_flags = RELEASE_ALL

    def wanted_outputs(self) -> Container[str]:
        names = self._core.requested_output_names()
        if names is None:
            return self._context.output_names
        # Only searched: a short list (one or two outputs, as usual) is searched faster
        # than a set is built.
        return names if len(names) <= 4 else frozenset(names)

    def finish(self, response: InferenceResponse) -> None:
        """Send ``response`` as this request's last (non-decoupled return path)."""
        if self._sender is not None:
            self._sender.send(response, 1)
            return
        self._finished = True
        self._admitted.stream.send_nowait(to_core(response, self.wanted_outputs(), True))
