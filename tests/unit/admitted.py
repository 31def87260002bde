"""Admitted requests for scheduler and backend tests: what ``InferenceService.submit`` makes."""

from __future__ import annotations

import asyncio

from tritium.core.cancellation import Cancellation
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.response import ResponseStream

# For tests that run no loop: the scheduler registers no callbacks and sends nothing, so a
# loop that never runs can own the cancellations and streams.
IDLE_LOOP = asyncio.new_event_loop()
IDLE_LOOP.close()


def admit(request: InferenceRequest, batch_size: int = 1, arrival_ns: int | None = None,
          loop: asyncio.AbstractEventLoop = IDLE_LOOP) -> AdmittedRequest:
    cancellation = Cancellation(loop)
    stream = ResponseStream(loop, cancellation)
    return AdmittedRequest(request, cancellation, stream, batch_size, arrival_ns)
