"""A connection's control frames: SETTINGS both ways, PING, and the send windows that
WINDOW_UPDATE and SETTINGS_INITIAL_WINDOW_SIZE move."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from tritium.frontends.grpc.http2 import (
    ACK,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    MAX_FRAME_LIMIT,
    MAX_WINDOW,
    FrameType,
    H2Error,
    ProtocolViolation,
    Setting,
    frame,
    parse_settings,
    rst_stream,
    settings_payload,
)
from tritium.frontends.grpc.windows import SendWindow, WindowError

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

_INCREMENT = struct.Struct(">I")  # a WINDOW_UPDATE's payload (its top bit is reserved)


class Control:
    def __init__(self, conn: GrpcConnection):
        self._conn = conn
        self.send_window = SendWindow(DEFAULT_WINDOW)  # the connection's, granted by the peer
        self.peer_initial_window = DEFAULT_WINDOW

    def open(self) -> None:
        """Our side of the connection preface, once the client's has arrived (an HTTP/1.1
        client that came here by mistake then reads a plain 400, not HTTP/2 frames)."""
        limits = self._conn.limits
        settings = settings_payload({
            Setting.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            Setting.INITIAL_WINDOW_SIZE: limits.stream_window,
            Setting.MAX_FRAME_SIZE: limits.max_frame_bytes,
            Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            Setting.ENABLE_PUSH: 0,
        })
        self._conn.outbox.out.append(frame(FrameType.SETTINGS, 0, 0, settings))
        self._conn.inbound.open()

    def on_settings(self, flags: int, stream_id: int, payload: memoryview) -> None:
        conn = self._conn
        if stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if not conn.flood.allow_settings(conn.now()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        grown = self._apply(parse_settings(bytes(payload)))
        # In the one output buffer, the ACK precedes every frame that relies on the new
        # values: the client judges our frames by its settings as acknowledged.
        conn.outbox.out.append(frame(FrameType.SETTINGS, ACK, 0))
        if grown:
            conn.outbox.pump_blocked()

    def _apply(self, values: dict[int, int]) -> bool:
        """Take the peer's settings; True if stream windows grew."""
        grown = False
        for key, value in values.items():
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, "window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self._conn.calls.values():
                    try:
                        call.send_window.grow(delta)
                    except WindowError:
                        raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR,
                                                "stream window grown past 2^31-1") from None
                grown = grown or delta > 0
            elif key == Setting.MAX_FRAME_SIZE and not (
                    DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT):
                # Valid values are only checked: frames stay at 16 KiB, which every peer
                # accepts whatever its setting is at the moment (gRPC clients move theirs
                # with their bandwidth estimate).
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "invalid MAX_FRAME_SIZE")
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "invalid ENABLE_PUSH")
        return grown

    def on_ping(self, flags: int, stream_id: int, payload: memoryview) -> None:
        conn = self._conn
        if stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
        if flags & ACK:
            conn.ping_answered(bytes(payload))
            return
        if not conn.flood.allow_ping(conn.now()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too_many_pings")
        conn.outbox.out.append(frame(FrameType.PING, ACK, 0, payload))

    def on_window_update(self, flags: int, stream_id: int, payload: memoryview) -> None:
        # Two a unary call (the connection's and its stream's): one unpack checks the size
        # and reads the increment.
        try:
            increment = _INCREMENT.unpack(payload)[0] & 0x7FFFFFFF
        except struct.error:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR,
                                    "WINDOW_UPDATE is not 4 bytes") from None
        if stream_id == 0:
            if not increment:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            window = self.send_window
            if window.size + increment > MAX_WINDOW:  # SendWindow.grow, without the call
                raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, "window overflow")
            window.size += increment
            if self._conn.outbox.blocked:
                self._conn.outbox.pump_blocked()
            return
        conn = self._conn
        call = conn.calls.get(stream_id)
        if call is None:
            if stream_id > conn.last_stream:  # idle: never opened
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a stream that just closed: the peer had not seen it yet
        if not increment:
            conn.stream_error(call, H2Error.PROTOCOL_ERROR)
            return
        window = call.send_window
        if window.size + increment > MAX_WINDOW:
            conn.stream_error(call, H2Error.FLOW_CONTROL_ERROR)
            return
        window.size += increment
        if call.pending:
            conn.outbox.pump(call)

    def on_priority(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "PRIORITY is not 5 bytes")
        if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF != stream_id:
            return  # advice this server does not take
        # RFC 9113 5.3.1: a stream that depends on itself is a stream error.
        conn = self._conn
        call = conn.calls.get(stream_id)
        if call is not None:
            conn.stream_error(call, H2Error.PROTOCOL_ERROR)
        else:
            conn.outbox.out.append(rst_stream(stream_id, H2Error.PROTOCOL_ERROR))
            conn.count_reset()

    def on_goaway(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        # The client opens no new streams; the ones in flight finish normally.

    def on_push_promise(self, flags: int, stream_id: int, payload: memoryview) -> None:
        raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

