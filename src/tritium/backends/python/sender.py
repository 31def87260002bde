"""pb_utils.InferenceResponseSender: the model's send half of one request's stream."""

from __future__ import annotations

import threading
from collections.abc import Container

from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.response import InferenceResponse, to_core
from tritium.core.request import AdmittedRequest
from tritium.core.response import InferenceResponse as CoreResponse

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class InferenceResponseSender:
    """Sends responses for one request from any thread until a FINAL closes it.

    Invariant: ``closed`` turns True exactly once, under ``_lock``, together with the
    FINAL being handed to the core stream; nothing reaches the stream after that.
    """

    __slots__ = ("_decoupled", "_lock", "_request", "_sent", "_wanted", "closed")

    def __init__(self, request: AdmittedRequest, wanted: Container[str], decoupled: bool) -> None:
        self._request = request
        self._wanted = wanted
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._sent = 0
        self.closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = _check_arguments(response, flags)
        with self._lock:
            self._check_state(response, final)
            self._sent += 1
            if final:
                self.closed = True
            self._push(response, final)

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
            if self.closed:
                return False
            self.closed = True
            self._request.stream.send_nowait(response)
            return True

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
        stream = self._request.stream
        if response is None:
            stream.send_nowait(CoreResponse.final_flag())
        else:
            stream.send_nowait(to_core(response, self._wanted, final))


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
