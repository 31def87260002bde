"""One gRPC-over-HTTP/2 connection: frames in, calls out, and every way a call can end early.

A call ends early when the client resets its stream (a cancel, or its own deadline), when
its ``grpc-timeout`` passes, when the connection drops, or at shutdown. The transport then
records why in ``Call.cancel_reason`` and cancels the call's task; the servicer turns that into
the request's cancellation. Nothing here knows about inference.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import hpack

from tritium.core.cancellation import CancelReason
from tritium.core.errors import TritiumError
from tritium.frontends.grpc.call import (
    BadMessage,
    Call,
    GrpcLimits,
    Router,
    StreamHandler,
    UnaryHandler,
    parse_message,
)
from tritium.frontends.grpc.http2 import (
    ACK,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FRAME_HEADER,
    MAX_FRAME_LIMIT,
    MAX_WINDOW,
    OK_TRAILERS,
    PREFACE,
    PRIORITY,
    RESPONSE_HEADERS,
    Chunk,
    FrameType,
    GrpcStatus,
    H2Error,
    ProtocolViolation,
    Setting,
    decompress,
    frame,
    goaway,
    header_block,
    length_prefixed,
    parse_settings,
    parse_timeout,
    references_only,
    rst_stream,
    settings_payload,
    strip_padding,
    trailers_block,
    window_update,
)
from tritium.frontends.grpc.status import grpc_status

log = logging.getLogger("tritium.grpc")

_HEADER_CACHE_SIZE = 64
# A streaming call whose client sent bytes that cannot be read is over: the requests it
# already started answer nobody.
_CALL_BROKEN = CancelReason.CLIENT_CANCELLED


class ConnectionRegistry:
    """The server's live connections and a wait for them to have no calls."""

    def __init__(self) -> None:
        self.connections: set[GrpcConnection] = set()
        self._idle: asyncio.Future[None] | None = None

    def active_calls(self) -> int:
        return sum(len(conn.calls) for conn in self.connections)

    def call_ended(self) -> None:
        if self._idle is not None and not self._idle.done() and not self.active_calls():
            self._idle.set_result(None)

    async def wait_idle(self) -> None:
        while self.active_calls():
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)


class GrpcConnection(asyncio.Protocol):
    """Frames are parsed as they arrive; a unary call is dispatched when its request is whole,
    a streaming call as soon as its headers are in."""

    def __init__(self, router: Router, registry: ConnectionRegistry, limits: GrpcLimits):
        self._router = router
        self._registry = registry
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport
        self._buf = bytearray()  # until the client's preface has been read
        self._partial: list[Chunk] = []  # an incomplete frame, in the pieces it came in
        self._partial_size = 0
        self._partial_needed = 0
        self._preface_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_bytes)
        self._header_cache: dict[bytes, dict[str, str]] = {}  # never mutated once stored
        self.calls: dict[int, Call] = {}
        self._blocked: dict[int, Call] = {}  # calls with bytes waiting for window
        self._last_stream = 0
        self._continuing: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._send_window = DEFAULT_WINDOW  # the connection's, granted by the peer
        self._peer_initial_window = DEFAULT_WINDOW
        self._recv_unacked = 0
        self._out: list[bytes] = []
        self._closed = False
        self._going_away = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._control: dict[int, Callable[[int, int, bytes], None]] = {
            FrameType.CONTINUATION: self._on_continuation,
            FrameType.WINDOW_UPDATE: self._on_window_update,
            FrameType.SETTINGS: self._on_settings,
            FrameType.PING: self._on_ping,
            FrameType.RST_STREAM: self._on_rst_stream,
            FrameType.GOAWAY: self._on_goaway,
            FrameType.PUSH_PROMISE: self._on_push_promise,
        }

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._registry.connections.add(self)

    def _open(self) -> None:
        """Our side of the connection preface, once the client's has arrived (an HTTP/1.1
        client that came here by mistake then reads a plain 400, not HTTP/2 frames)."""
        limits = self._limits
        settings = settings_payload({
            Setting.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            Setting.INITIAL_WINDOW_SIZE: limits.stream_window,
            Setting.MAX_FRAME_SIZE: limits.max_frame_bytes,
            Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            Setting.ENABLE_PUSH: 0,
        })
        self.transport.write(frame(FrameType.SETTINGS, 0, 0, settings) + window_update(
            0, limits.connection_window - DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for call in list(self.calls.values()):
            self._abort(call, CancelReason.CLIENT_DISCONNECTED)
        self._registry.connections.discard(self)
        self._registry.call_ended()
        self._wake_writers()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writers()

    def data_received(self, data: bytes) -> None:
        if not self._preface_seen:
            buf = self._buf
            buf += data
            if not self._take_preface(buf):
                return
            data, buf[:] = bytes(buf), b""
        elif self._partial:
            # Part of a frame is waiting: keep the pieces until the frame is whole, then
            # join them once (a large DATA frame arrives over many reads).
            self._partial.append(data)
            self._partial_size += len(data)
            if self._partial_size < self._partial_needed:
                return
            data = b"".join(self._partial)
            self._partial.clear()
        try:
            pos = self._read_frames(data)
        except ProtocolViolation as exc:
            self._fail(exc.code, str(exc))
            return
        if self._closed:
            return
        if pos < len(data):
            self._keep_partial(memoryview(data)[pos:])
        if self._out:
            self.transport.write(b"".join(self._out))
            self._out.clear()

    def _keep_partial(self, rest: memoryview) -> None:
        """Hold an incomplete frame until ``_partial_needed`` bytes of it have arrived (its
        whole length once its header is in; ``_read_frames`` has checked that length)."""
        self._partial.append(rest)
        self._partial_size = len(rest)
        self._partial_needed = 9 + int.from_bytes(rest[:3], "big") if len(rest) >= 9 else 9

    def _take_preface(self, buf: bytearray) -> bool:
        """True once the client's connection preface has been read off ``buf``."""
        if buf[:len(PREFACE)] != PREFACE[:len(buf)]:
            self._reject_non_http2()
            return False
        if len(buf) < len(PREFACE):
            return False
        del buf[:len(PREFACE)]
        self._preface_seen = True
        self._open()
        return True

    def _read_frames(self, data: bytes) -> int:
        """Handle every whole frame in ``data``; returns how many bytes they took. Payloads
        are views of ``data`` (immutable), so a large DATA frame is not copied here."""
        pos, size = 0, len(data)
        max_frame = self._limits.max_frame_bytes
        unpack = FRAME_HEADER.unpack_from
        view = memoryview(data)
        while size - pos >= 9:
            word, flags, stream_id = unpack(data, pos)
            length = word >> 8
            if length > max_frame:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR,
                                        f"frame of {length} bytes exceeds {max_frame}")
            end = pos + 9 + length
            if end > size:
                break
            kind = word & 0xFF
            stream_id &= 0x7FFFFFFF
            payload = view[pos + 9:end]
            pos = end
            if self._continuing is not None and kind != FrameType.CONTINUATION:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR,
                                        "header block interrupted by another frame")
            if kind == FrameType.DATA:
                self._on_data(stream_id, flags, payload)
            elif kind == FrameType.HEADERS:
                self._on_headers(stream_id, flags, bytes(payload))
            else:
                handler = self._control.get(kind)
                if handler is not None:  # PRIORITY and unknown types are ignored
                    handler(stream_id, flags, bytes(payload))
            if self._closed:
                break
        return pos

    # -- inbound frames ------------------------------------------------------------------
    def _on_headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "HEADERS on stream 0")
        payload = strip_padding(payload, flags)
        if flags & PRIORITY:
            payload = payload[5:]
        if not flags & END_HEADERS:
            self._continuing = (stream_id, flags, bytearray(payload))
            return
        self._on_header_block(stream_id, flags, payload)

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        if self._continuing is None or self._continuing[0] != stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "unexpected CONTINUATION")
        _, first_flags, block = self._continuing
        block += payload
        if len(block) > self._limits.max_header_list_bytes:
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._continuing = None
            self._on_header_block(stream_id, first_flags, bytes(block))

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode_headers(block)
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client: only their END_STREAM matters
            if flags & END_STREAM:
                self._remote_closed(call)
            return
        if stream_id <= self._last_stream or not stream_id & 1:
            if stream_id > self._last_stream:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "even stream id from client")
            return  # a stream this side already finished
        self._last_stream = stream_id
        if self._going_away or len(self.calls) >= self._limits.max_concurrent_streams:
            self._out.append(rst_stream(stream_id, H2Error.REFUSED_STREAM))
            return
        self._start_call(stream_id, headers, bool(flags & END_STREAM))

    def _decode_headers(self, block: bytes) -> dict[str, str]:
        """The block's fields. A client repeating a call sends the same block of table
        references each time; such a block does not change the decoder's table, so its
        fields are remembered until a block that may change the table arrives."""
        cache = self._header_cache
        headers = cache.get(block)
        if headers is not None:
            return headers
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise ProtocolViolation(H2Error.COMPRESSION_ERROR, f"bad header block: {exc}") from None
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in fields}
        if not references_only(block):
            cache.clear()
        elif len(cache) < _HEADER_CACHE_SIZE:
            cache[block] = headers
        return headers

    def _start_call(self, stream_id: int, headers: dict[str, str], ended: bool) -> None:
        path = headers.get(":path", "")
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            block = header_block((b":status", b"415"), (b"content-type", b"text/plain"))
            self._out.append(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, stream_id, block))
            if not ended:
                self._out.append(rst_stream(stream_id, H2Error.NO_ERROR))
            return
        rpc = self._router.get(path)
        encoding = headers.get("grpc-encoding", "identity")
        if rpc is None:
            self._refuse(stream_id, ended, GrpcStatus.UNIMPLEMENTED, f"unknown method {path}")
            return
        if encoding not in ("identity", "gzip", "deflate"):
            self._refuse(stream_id, ended, GrpcStatus.UNIMPLEMENTED,
                         f"unsupported grpc-encoding '{encoding}'")
            return
        call = Call(self, stream_id, rpc, encoding, self._peer_initial_window, headers)
        self.calls[stream_id] = call
        timeout = headers.get("grpc-timeout")
        if timeout is not None:
            try:
                seconds = parse_timeout(timeout)
            except ValueError as exc:
                self._end(call, GrpcStatus.INVALID_ARGUMENT, str(exc))
                return
            call.deadline = self._loop.time() + seconds
            call.timer = self._loop.call_at(call.deadline, self._expire, call)
        if rpc.stream is not None:
            call.task = self._loop.create_task(self._serve_stream(call, rpc.stream))
        if ended:
            self._remote_closed(call)

    def _refuse(self, stream_id: int, ended: bool, status: GrpcStatus, message: str) -> None:
        block = trailers_block(status, message, headers_sent=False)
        self._out.append(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, stream_id, block))
        if not ended:
            self._out.append(rst_stream(stream_id, H2Error.NO_ERROR))

    def _on_data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        self._recv_unacked += len(payload)
        if self._recv_unacked >= self._limits.connection_window // 2:
            self._out.append(window_update(0, self._recv_unacked))
            self._recv_unacked = 0
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id == 0 or stream_id > self._last_stream:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # the call already ended on this side
        if call.remote_closed:
            raise ProtocolViolation(H2Error.STREAM_CLOSED, "DATA after END_STREAM")
        data = strip_padding(payload, flags)
        if not flags & END_STREAM:
            call.recv_unacked += len(payload)
            if call.recv_unacked >= self._limits.stream_window // 2:
                self._out.append(window_update(stream_id, call.recv_unacked))
                call.recv_unacked = 0
        if data and not self._take_messages(call, data):
            return
        if flags & END_STREAM:
            self._remote_closed(call)

    def _take_messages(self, call: Call, data: memoryview) -> bool:
        """Split the stream's bytes into messages; False if the call ended over a bad one."""
        inbuf = call.inbuf
        limit = self._limits.max_message_bytes
        if not inbuf and len(data) >= 5 and len(data) == 5 + int.from_bytes(data[1:5], "big"):
            chunks: list[memoryview] = [data]  # usual: one whole message in this frame
        else:
            inbuf += data
            chunks = []
            while len(inbuf) >= 5:
                size = int.from_bytes(inbuf[1:5], "big")
                if size > limit or len(inbuf) < 5 + size:
                    break
                if len(inbuf) == 5 + size:  # the buffer is exactly this message: keep it
                    chunks.append(memoryview(inbuf))
                    inbuf = call.inbuf = bytearray()
                    break
                chunks.append(memoryview(bytes(inbuf[:5 + size])))
                del inbuf[:5 + size]
        if len(inbuf) >= 5 and int.from_bytes(inbuf[1:5], "big") > limit:
            self._end(call, GrpcStatus.RESOURCE_EXHAUSTED,
                      f"received message larger than max ({int.from_bytes(inbuf[1:5], 'big')}"
                      f" vs. {limit})", _CALL_BROKEN)
            return False
        for chunk in chunks:
            message: bytes | memoryview = chunk[5:]
            if chunk[0]:
                if call.encoding == "identity":
                    self._end(call, GrpcStatus.INTERNAL,
                              "compressed message without a grpc-encoding", _CALL_BROKEN)
                    return False
                try:
                    message = decompress(message, call.encoding, limit)
                except ValueError as exc:
                    self._end(call, GrpcStatus.INTERNAL, str(exc), _CALL_BROKEN)
                    return False
            call.messages.append(message)
        if chunks and call.rpc.stream is not None:
            call.wake()
        return True

    def _remote_closed(self, call: Call) -> None:
        call.remote_closed = True
        if call.ended:
            return
        rpc = call.rpc
        if rpc.unary is None:
            call.wake()
            return
        if call.inbuf or len(call.messages) != 1:
            count = len(call.messages) + (1 if call.inbuf else 0)
            self._end(call, GrpcStatus.INTERNAL if call.inbuf else GrpcStatus.UNIMPLEMENTED,
                      "incomplete request message" if call.inbuf else
                      f"a unary method takes exactly one request message, got {count}")
            return
        try:
            request = parse_message(rpc.request_type.FromString, call.messages.popleft())
        except BadMessage as exc:
            self._end(call, GrpcStatus.INVALID_ARGUMENT, str(exc))
            return
        call.task = self._loop.create_task(self._serve_unary(call, rpc.unary, request))

    def _on_settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        grown = self._apply_settings(parse_settings(payload))
        # The ACK goes out before any frame that relies on the new values: the client judges
        # our frames by its settings as acknowledged.
        self._out.append(frame(FrameType.SETTINGS, ACK, 0))
        self.transport.write(b"".join(self._out))
        self._out.clear()
        if grown:
            self._pump_blocked()

    def _on_ping(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
        if not flags & ACK:
            self._out.append(frame(FrameType.PING, ACK, 0, payload))

    def _on_rst_stream(self, stream_id: int, flags: int, payload: bytes) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            self._abort(call, self._reason_for_reset(call))

    def _on_goaway(self, stream_id: int, flags: int, payload: bytes) -> None:
        pass  # the client opens no new streams; the ones in flight finish normally

    def _on_push_promise(self, stream_id: int, flags: int, payload: bytes) -> None:
        raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _reason_for_reset(self, call: Call) -> CancelReason:
        # A client's own deadline resets the stream a little before this side's copy of it
        # runs out (that one started counting only when the headers arrived).
        if call.deadline is not None and call.deadline - self._loop.time() <= DEADLINE_SLACK_S:
            return CancelReason.DEADLINE
        return CancelReason.CLIENT_CANCELLED

    def _apply_settings(self, values: dict[int, int]) -> bool:
        """Take the peer's settings; True if stream windows grew."""
        grown = False
        for key, value in values.items():
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, "window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for call in self.calls.values():
                    call.send_window += delta
                grown = grown or delta > 0
            elif key == Setting.MAX_FRAME_SIZE and not (
                    DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT):
                # Valid values are only checked: frames stay at 16 KiB, which every peer
                # accepts whatever its setting is at the moment (gRPC clients move theirs
                # with their bandwidth estimate).
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "invalid MAX_FRAME_SIZE")
        return grown

    def _on_window_update(self, stream_id: int, flags: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "WINDOW_UPDATE is not 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, "window overflow")
            self._pump_blocked()
            return
        call = self.calls.get(stream_id)
        if call is None:
            return
        if not increment or call.send_window + increment > MAX_WINDOW:
            # A stream error: this call ends, the connection goes on.
            self._out.append(rst_stream(stream_id, H2Error.PROTOCOL_ERROR if not increment
                                        else H2Error.FLOW_CONTROL_ERROR))
            self._abort(call, CancelReason.CLIENT_CANCELLED)
            return
        call.send_window += increment
        if call.pending:
            self._pump(call)

    # -- outbound ------------------------------------------------------------------------
    def send(self, call: Call, data: bytes, trailers: bytes | None) -> None:
        """Write ``data`` (framed messages), then ``trailers`` if given, as far as flow
        control allows; the rest goes out as the peer grants credit."""
        if self._closed:
            return
        parts: list[Chunk] = []
        if not call.headers_sent:
            call.headers_sent = True
            parts.append(frame(FrameType.HEADERS, END_HEADERS, call.stream_id, RESPONSE_HEADERS))
        if call.pending:
            call.pending.append(data)
        else:
            rest = self._frame_data(call, data, parts)
            if rest is not None:
                call.pending.append(rest)
        if trailers is not None:
            if call.pending:
                call.trailers = trailers
            else:
                parts.append(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, call.stream_id,
                                   trailers))
        self._write_parts(parts)

    def _frame_data(self, call: Call, data: bytes | memoryview, parts: list[Chunk]
                    ) -> bytes | memoryview | None:
        """Frame what the windows allow into ``parts``; returns the rest."""
        stream_id = call.stream_id
        if len(data) <= DEFAULT_MAX_FRAME and len(data) <= self._send_window and \
                len(data) <= call.send_window:
            parts.append(frame(FrameType.DATA, 0, stream_id, data))
            self._send_window -= len(data)
            call.send_window -= len(data)
            return None
        view = memoryview(data)  # of immutable bytes: slices are written without copies
        while view:
            size = min(len(view), DEFAULT_MAX_FRAME, self._send_window, call.send_window)
            if size <= 0:
                self._blocked[stream_id] = call
                return view
            parts.append(FRAME_HEADER.pack((size << 8) | FrameType.DATA, 0, stream_id))
            parts.append(view[:size])
            self._send_window -= size
            call.send_window -= size
            view = view[size:]
        return None

    def _pump(self, call: Call) -> None:
        parts: list[Chunk] = []
        pending = call.pending
        self._blocked.pop(call.stream_id, None)
        while pending:
            rest = self._frame_data(call, pending.popleft(), parts)
            if rest is not None:
                pending.appendleft(rest)
                break
        finished = not pending and call.trailers is not None
        if finished:
            parts.append(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, call.stream_id,
                               call.trailers or b""))
            call.trailers = None
        if parts and not self._closed:
            self._write_parts(parts)
        if finished:
            self._close(call, None)
        if not pending:
            self._wake_writers()

    def _write_parts(self, parts: list[Chunk]) -> None:
        if len(parts) <= 3:  # a small response: one buffer is cheapest
            self.transport.write(b"".join(parts))
        else:  # large data: its views go to the socket without being joined
            self.transport.writelines(parts)

    def _pump_blocked(self) -> None:
        for call in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._pump(call)

    async def wait_writable(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()
        await self._writable

    def _wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- ending calls --------------------------------------------------------------------
    def _end(self, call: Call, status: GrpcStatus, message: str = "",
             reason: CancelReason | None = None) -> None:
        """Finish the call from this side with ``status``. An end the handler did not ask for
        (``reason``: deadline, shutdown) drops what is still waiting to be sent and cancels
        the handler's task."""
        if call.ended:
            return
        call.ended = True
        if reason is not None:
            call.pending.clear()
            self._blocked.pop(call.stream_id, None)
        if status == GrpcStatus.OK and not message and call.headers_sent:
            trailers = OK_TRAILERS
        else:
            trailers = trailers_block(status, message, call.headers_sent)
        call.headers_sent = True
        if call.pending:
            call.trailers = trailers  # follows the data still waiting for credit
            self._stop_task(call, reason)
            return
        self._out_or_write(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, call.stream_id,
                                 trailers))
        self._close(call, reason)

    def _close(self, call: Call, reason: CancelReason | None) -> None:
        if not call.remote_closed:
            # RFC 9113 §8.1: a complete response may be followed by RST_STREAM(NO_ERROR) so
            # the client stops sending a request nobody reads.
            self._out_or_write(rst_stream(call.stream_id, H2Error.NO_ERROR))
        self._stop_task(call, reason)
        self._forget(call)

    def _stop_task(self, call: Call, reason: CancelReason | None) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        task = call.task
        if reason is not None and task is not None and not task.done():
            call.cancel_reason = reason
            task.cancel()
        call.wake()

    def _forget(self, call: Call) -> None:
        self.calls.pop(call.stream_id, None)
        self._blocked.pop(call.stream_id, None)
        if not self.calls:
            self._registry.call_ended()
            if self._going_away:
                self._close_transport()

    def _abort(self, call: Call, reason: CancelReason) -> None:
        """The call is over for the client (reset, gone): nothing more is sent for it."""
        call.ended = True
        call.pending.clear()
        call.trailers = None
        self._stop_task(call, reason)
        self._forget(call)

    def _expire(self, call: Call) -> None:
        call.timer = None
        self._end(call, GrpcStatus.DEADLINE_EXCEEDED, "Deadline Exceeded", CancelReason.DEADLINE)

    def _out_or_write(self, data: bytes) -> None:
        if self._closed:
            return
        self.transport.write(data)

    # -- serving -------------------------------------------------------------------------
    async def _serve_unary(self, call: Call, handler: UnaryHandler, request: Any) -> None:
        try:
            reply = await handler(request, call)
        except asyncio.CancelledError:
            return  # the call ended under it; the ending already answered the client
        except TritiumError as exc:
            self._end(call, grpc_status(exc.code), exc.message)
            return
        except Exception as exc:
            log.exception("gRPC method %s failed", call.rpc.request_type.__name__)
            self._end(call, GrpcStatus.INTERNAL, f"internal error: {exc}")
            return
        if call.ended:
            return
        call.ended = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if isinstance(reply, list):  # already serialized, in pieces (see Rpc)
            size = sum(len(piece) for piece in reply)
            body = b"".join([b"\x00", size.to_bytes(4, "big"), *reply])
        else:
            body = length_prefixed(reply.SerializeToString())
        self.send(call, body, OK_TRAILERS)
        if not call.pending:
            self._forget(call)

    async def _serve_stream(self, call: Call, handler: StreamHandler) -> None:
        try:
            await handler(call)
        except asyncio.CancelledError:
            return
        except TritiumError as exc:
            self._end(call, grpc_status(exc.code), exc.message)
            return
        except BadMessage as exc:
            self._end(call, GrpcStatus.INVALID_ARGUMENT, str(exc))
            return
        except Exception as exc:
            log.exception("gRPC streaming method failed")
            self._end(call, GrpcStatus.INTERNAL, f"internal error: {exc}")
            return
        self._end(call, GrpcStatus.OK)

    # -- the connection as a whole -------------------------------------------------------
    def go_away(self) -> None:
        """Refuse new streams; close once the calls in flight have finished."""
        if self._closed or self._going_away:
            return
        if not self._preface_seen:  # not an HTTP/2 connection yet: nothing to say
            self._close_transport()
            return
        self._going_away = True
        self.transport.write(goaway(self._last_stream, H2Error.NO_ERROR))
        if not self.calls:
            self._close_transport()

    def shut_down(self, status: GrpcStatus, message: str) -> None:
        """End every call still running with ``status`` and close."""
        for call in list(self.calls.values()):
            self._end(call, status, message, CancelReason.SHUTDOWN)
        self._close_transport()

    def _close_transport(self) -> None:
        if not self._closed:
            self.transport.close()

    def _fail(self, code: H2Error, message: str) -> None:
        log.info("closing a gRPC connection: %s", message)
        self.transport.write(b"".join(self._out) + goaway(self._last_stream, code, message))
        self._out.clear()
        self._closed = True
        self.transport.close()

    def _reject_non_http2(self) -> None:
        if bytes(self._buf[:4]) in (b"GET ", b"POST", b"PUT ", b"HEAD"):
            body = b"this port speaks gRPC (HTTP/2 with prior knowledge)\n"
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self._closed = True
        self.transport.close()


DEADLINE_SLACK_S = 0.1
