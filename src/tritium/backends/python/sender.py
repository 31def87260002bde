"""pb_utils.InferenceResponseSender: the model's send half of one request's stream."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Container

from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.response import InferenceResponse, to_core
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import InferenceResponse as CoreResponse
from tritium.core.response import StreamClosedError
from tritium.core.types import Tensor as CoreTensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class InferenceResponseSender:
    """Sends responses for one request from any thread until a FINAL closes it.

    Invariants, under ``_lock``: ``closed`` (the model may send no more) turns True
    once; ``_ended`` (the core stream got its final response) turns True once, and
    nothing reaches the stream after it. A non-decoupled request ends with its first
    response: as in Triton, whatever the model sends after that is not delivered.
    """

    __slots__ = (
        "_abandon_message", "_decoupled", "_ended", "_lock", "_request", "_sent", "_wanted",
        "closed",
    )

    def __init__(self, request: AdmittedRequest, wanted: Container[str], decoupled: bool) -> None:
        self._request = request
        self._wanted = wanted
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._sent = 0
        self._ended = False
        self._abandon_message: str | None = None
        self.closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = _check_arguments(response, flags)
        with self._lock:
            self._check_state(response, final)
            self._sent += 1
            if final:
                self.closed = True
            if not self._ended:
                self._push(response, final or not self._decoupled)

    def is_cancelled(self) -> bool:
        return self._request.cancellation.is_cancelled()

    @property
    def responses_sent(self) -> int:
        return self._sent

    # -- for the backend ---------------------------------------------------------
    def check_returned(self) -> None:
        """Raise as Triton does when ``execute`` also returns a response for this request."""
        with self._lock:
            self._check_state(InferenceResponse(), final=True)

    def close_with(self, response: CoreResponse) -> bool:
        """End the request with ``response`` unless it has ended; False if it had."""
        with self._lock:
            self.closed = True
            if self._ended:
                return False
            self._ended = True
            self._request.stream.send_nowait(response)
            return True

    def mark_finished(self) -> None:
        """The backend already sent this request's last response without a sender."""
        with self._lock:
            self.closed = self._ended = True

    def fail_when_abandoned(self, message: str) -> None:
        """End the request with ``message`` if this sender is dropped before it ends.

        A non-decoupled ``execute`` may return None and respond later through the
        sender (Triton allows it); once nothing can reach the sender any more, no
        response can come, and the client gets this error instead of waiting forever.
        """
        self._abandon_message = message

    def __del__(self) -> None:
        message = self._abandon_message
        if message is not None and not self._ended:
            self._ended = True
            failure = TritiumError(ErrorCode.INTERNAL, message)
            # A stream ended by the core meanwhile, or a loop gone at shutdown, needs
            # nothing more; __del__ could only print the exception.
            with contextlib.suppress(StreamClosedError, RuntimeError):
                self._request.stream.send_nowait(CoreResponse.failure(failure))

    def _check_state(self, response: InferenceResponse | None, final: bool) -> None:
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than "
                    "one response."
                )
            if response is None and final and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete "
                    "final before sending a response."
                )
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")

    def _push(self, response: InferenceResponse | None, final: bool) -> None:
        self._ended = final
        stream = self._request.stream
        if response is None:
            stream.send_nowait(CoreResponse.final_flag())
            return
        core = to_core(response, self._wanted, final)
        if getattr(stream, "keeps_arrays", True):
            # As Triton, which copies a sent response out at once: the model may write
            # the same array again before the client is sent this one.
            core.outputs = [_copied(tensor) for tensor in core.outputs]
        stream.send_nowait(core)


def _copied(tensor: CoreTensor) -> CoreTensor:
    data = tensor.data
    if not data.flags.writeable:  # nothing can change it: inputs, or arrays we copied
        return tensor
    return CoreTensor(tensor.name, tensor.datatype, tensor.shape, data.copy())


def _check_arguments(response: InferenceResponse | None, flags: int) -> bool:
    if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
        raise TritonModelException("Unable to send response. Unsupported flag provided.")
    if response is None and flags == 0:
        raise TritonModelException(
            "Inference Response object must be provided when the response flags is set to zero."
        )
    if response is not None and not isinstance(response, InferenceResponse):
        raise TypeError(
            f"response must be a pb_utils.InferenceResponse, found '{type(response).__name__}'"
        )
    return flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
