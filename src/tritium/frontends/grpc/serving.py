"""Running a call's handler: a unary call once its one message is whole, a streaming call as
soon as its headers are in; what the handler returns or raises becomes the call's end."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from tritium.core.errors import TritiumError
from tritium.frontends.grpc import parse
from tritium.frontends.grpc.call import CALL_BROKEN, BadMessage, Call
from tritium.frontends.grpc.call_state import DECIDED
from tritium.frontends.grpc.messages import BufferExhausted, inflate
from tritium.frontends.grpc.parse import DEFAULT_BUDGET
from tritium.frontends.grpc.status import GrpcStatus, grpc_status

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

log = logging.getLogger("tritium.grpc")


def dispatch_unary(conn: GrpcConnection, call: Call) -> None:
    if call.reader.partial or len(call.messages) != 1:  # a message half in, or not just one
        count = len(call.messages) + (1 if call.reader.partial else 0)
        conn.finish(call, GrpcStatus.INTERNAL if call.reader.partial else
                    GrpcStatus.UNIMPLEMENTED, "incomplete request message"
                    if call.reader.partial else
                    f"a unary method takes exactly one request message, got {count}")
        return
    message = conn.inbound.take(call)
    call.task = asyncio.get_running_loop().create_task(
        serve_unary(conn, call, message.body, message.compressed))



async def read_message(conn: GrpcConnection, call: Call, body: bytes | memoryview,
                       compressed: bool) -> Any:
    if not compressed:
        # A big message is parsed in slices, so the loop serves others meanwhile.
        return await parse.parse_message(call.rpc.request_type, body)
    if call.encoding == "identity":
        raise BadMessage("compressed message without a grpc-encoding", GrpcStatus.INTERNAL)
    inbound = conn.inbound
    held = 0

    def hold(count: int) -> bool:
        nonlocal held
        if not inbound.hold_inflated(count):
            return False
        held += count
        return True

    try:
        inflated = await inflate(body, call.encoding, inbound.message_limit, hold)
        return await parse.parse_message(call.rpc.request_type, inflated)
    except BufferExhausted as exc:
        raise BadMessage(str(exc), GrpcStatus.RESOURCE_EXHAUSTED) from None
    except ValueError as exc:
        raise BadMessage(str(exc), GrpcStatus.INTERNAL) from None
    finally:
        # The inflated bytes are held from the first step until the message is parsed.
        inbound.release_inflated(held)



async def serve_unary(conn: GrpcConnection, call: Call, body: bytes | memoryview,
                      compressed: bool) -> None:
    handler = call.rpc.unary
    assert handler is not None
    try:
        if compressed or len(body) > DEFAULT_BUDGET.inline_bytes:
            request = await read_message(conn, call, body, compressed)
        else:  # the usual case, without a coroutine for it (nor parse_message's call)
            try:
                request = call.rpc.request_type.FromString(body)
            except DecodeError as exc:
                raise BadMessage(f"request message does not parse: {exc}") from None
        reply = await handler(request, call)
    except Exception as exc:
        fail_call(conn, call, exc)
        return
    if call.state in DECIDED:
        return
    if isinstance(reply, list):  # already serialized, in pieces (see Rpc)
        conn.answer(call, reply, sum(map(len, reply)))
    else:
        body = reply.SerializeToString()
        conn.answer(call, [body], len(body))



async def serve_stream(conn: GrpcConnection, call: Call) -> None:
    handler = call.rpc.stream
    assert handler is not None
    try:
        await handler(call)
    except Exception as exc:
        fail_call(conn, call, exc)
        return
    conn.finish(call, GrpcStatus.OK)



def fail_call(conn: GrpcConnection, call: Call, exc: Exception) -> None:
    if isinstance(exc, TritiumError):
        conn.finish(call, grpc_status(exc.code), exc.message)
    elif isinstance(exc, BadMessage):
        conn.finish(call, exc.status, str(exc), CALL_BROKEN)
    else:
        log.exception("gRPC method %s failed", call.headers.get(":path"), exc_info=exc)
        conn.finish(call, GrpcStatus.INTERNAL, f"internal error: {exc}")

