"""The send side of a connection: reply bytes framed as the peer's windows allow, the rest
queued per call and written as credit arrives, trailers after the last queued byte."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from tritium.frontends.grpc.call import Call
from tritium.frontends.grpc.http2 import (
    DEFAULT_MAX_FRAME,
    END_HEADERS,
    END_STREAM,
    FRAME_HEADER,
    Chunk,
    FrameType,
    H2Error,
    frame,
    rst_stream,
)
from tritium.frontends.grpc.windows import SendWindow
from tritium.frontends.grpc.wire import OK_TRAILERS, RESPONSE_HEADERS

# The hot frames are packed here, as http2.frame would (a call less for each).
_RESPONSE_HEADERS_WORD = (len(RESPONSE_HEADERS) << 8) | FrameType.HEADERS
_OK_TRAILERS_WORD = (len(OK_TRAILERS) << 8) | FrameType.HEADERS
# A whole reply's first bytes in one pack: the HEADERS frame, the DATA frame's header and
# the message's prefix (compressed flag, length).
_REPLY_START = struct.Struct(f">IBI{len(RESPONSE_HEADERS)}sIBIBI")


class Output(Protocol):
    """Where a connection's bytes go (an asyncio transport, or a test's list)."""

    def write(self, chunks: list[Chunk]) -> None: ...
    def close(self) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Outbox:
    """Frames for the connection's one output buffer (``out``), in the order they go out.

    ``flushed(call)`` is called when a call's trailers are in the buffer: everything queued
    for it has been framed.
    """

    def __init__(self, window: SendWindow, flushed: Callable[[Call], None]):
        self.window = window
        self.out: list[Chunk] = []
        self.blocked: dict[int, Call] = {}  # calls with bytes waiting for credit
        self._flushed = flushed

    def data(self, call: Call, data: bytes | memoryview) -> None:
        """Frame ``data`` for ``call`` as far as the windows allow; queue the rest."""
        out = self.out
        if not call.headers_sent:
            call.headers_sent = True
            out.append(FRAME_HEADER.pack(_RESPONSE_HEADERS_WORD, END_HEADERS, call.stream_id)
                       + RESPONSE_HEADERS)
        if call.pending:
            call.pending.append(data)
            return
        rest = self._frame(call, data)
        if rest is not None:
            call.pending.append(rest)

    def whole_reply(self, call: Call, pieces: list[Chunk], size: int) -> bool:
        """Frame a whole reply at once, as ``data`` then ``trailers(OK_TRAILERS)`` would:
        response headers, one message (serialized in ``pieces``, ``size`` bytes), OK
        trailers. False, with nothing framed, unless nothing was sent for ``call`` yet and
        the message fits one frame and both windows. ``flushed`` is not called."""
        length = size + 5
        window, call_window = self.window, call.send_window
        # Nothing is queued for a call whose headers are still to go (``data`` sends them).
        if call.headers_sent or length > DEFAULT_MAX_FRAME or length > window.size or \
                length > call_window.size:
            return False
        call.headers_sent = True
        window.size -= length
        call_window.size -= length
        stream_id = call.stream_id
        self.out.append(b"".join([
            _REPLY_START.pack(_RESPONSE_HEADERS_WORD, END_HEADERS, stream_id, RESPONSE_HEADERS,
                              length << 8, 0, stream_id, 0, size),
            *pieces,
            FRAME_HEADER.pack(_OK_TRAILERS_WORD, END_HEADERS | END_STREAM, stream_id),
            OK_TRAILERS]))
        return True

    def trailers(self, call: Call, block: bytes) -> None:
        """End ``call`` with ``block`` once its queued data is out."""
        if call.pending:
            call.trailers = block
            return
        self.out.append(FRAME_HEADER.pack((len(block) << 8) | FrameType.HEADERS,
                                          END_HEADERS | END_STREAM, call.stream_id) + block)
        self._flushed(call)

    def answer_only(self, stream_id: int, ended: bool, block: bytes) -> None:
        """A complete answer to a stream that never becomes a call."""
        self.out.append(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, stream_id, block))
        if not ended:
            self.out.append(rst_stream(stream_id, H2Error.NO_ERROR))

    def drop(self, call: Call) -> None:
        if call.pending or call.trailers is not None:
            call.pending.clear()
            call.trailers = None
            self.blocked.pop(call.stream_id, None)

    def pump(self, call: Call) -> None:
        """Frame what new credit allows of ``call``'s queue (and its trailers after it)."""
        pending = call.pending
        self.blocked.pop(call.stream_id, None)
        while pending:
            rest = self._frame(call, pending.popleft())
            if rest is not None:
                pending.appendleft(rest)
                return
        if call.trailers is not None:
            block, call.trailers = call.trailers, None
            self.trailers(call, block)

    def pump_blocked(self) -> None:
        for call in list(self.blocked.values()):
            if self.window.size <= 0:
                return
            self.pump(call)

    def _frame(self, call: Call, data: bytes | memoryview) -> bytes | memoryview | None:
        """Frame what the windows allow into ``out``; returns the rest."""
        stream_id, size = call.stream_id, len(data)
        conn_window, call_window = self.window, call.send_window
        if size <= DEFAULT_MAX_FRAME and size <= conn_window.size and size <= call_window.size:
            self.out.append(FRAME_HEADER.pack((size << 8) | FrameType.DATA, 0, stream_id) + data)
            conn_window.size -= size
            call_window.size -= size
            return None
        view = memoryview(data)  # of immutable bytes: slices are written without copies
        out = self.out
        while view:
            size = min(len(view), DEFAULT_MAX_FRAME, conn_window.size, call_window.size)
            if size <= 0:
                self.blocked[stream_id] = call
                return view
            out.append(FRAME_HEADER.pack((size << 8) | FrameType.DATA, 0, stream_id))
            out.append(view[:size])
            conn_window.size -= size
            call_window.size -= size
            view = view[size:]
        return None
