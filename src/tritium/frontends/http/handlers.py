"""HTTP endpoints: each decodes, calls ``core.InferenceService``, and encodes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tritium.core import offload, tracing
from tritium.core.cancellation import Cancellation
from tritium.core.errors import TritiumError, invalid
from tritium.core.header_forward import HeaderForward
from tritium.core.model import ModelHandle, ModelMetadata
from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.service import InferenceService
from tritium.core.shared_memory import ReadOnLoop, SharedMemoryRegistry
from tritium.frontends.http import codec, compression, generate
from tritium.frontends.http import shared_memory as shm
from tritium.frontends.http.exchange import BodyPart, HttpExchange
from tritium.frontends.http.openai import endpoints as openai
from tritium.frontends.http.routes import Match, NoRoute, Router
from tritium.frontends.http.statistics import encode_statistics
from tritium.frontends.http.status import http_status

log = logging.getLogger("tritium.http")
T = TypeVar("T")

JSON = [("Content-Type", "application/json")]
SSE = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]


def respond_json(exchange: HttpExchange, status: int, payload: Any) -> None:
    exchange.respond(status, JSON, orjson.dumps(payload))


def respond_error(exchange: HttpExchange, error: TritiumError) -> None:
    exchange.respond(http_status(error.code), JSON, codec.encode_error(error))


def parse_version(text: str | None) -> int | None:
    if not text:
        return None
    if not text.isdigit():
        raise invalid(f"invalid model version '{text}'")
    return int(text)


class HttpApi:
    """The application the transport calls for every exchange."""

    def __init__(self, service: InferenceService, max_input_size: int,
                 header_forward: HeaderForward | None = None,
                 tokenizer_dir: Path | None = None,
                 shared_memory: SharedMemoryRegistry | None = None):
        self.service = service
        # Regions clients registered, shared with gRPC; none may be without --allow-client-shm.
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self.max_input_size = max_input_size
        self.header_forward = header_forward  # /infer only, as in Triton
        # /v1: tokenizer files for the models whose own directory has none (--tokenizer).
        self.tokenizer_dir = tokenizer_dir
        self.router: Router[Endpoint] = Router(ROUTES)

    async def __call__(self, exchange: HttpExchange) -> None:
        request = exchange.request
        try:
            endpoint, match = self.router.match(request.method, request.path)
        except NoRoute as exc:
            exchange.respond(exc.status, JSON, openai.route_error(exc.status, exc.message)
                             if request.path.startswith("/v1/")
                             else orjson.dumps({"error": exc.message}))
            return
        try:
            await endpoint(self, exchange, match)
        except TritiumError as exc:
            if not exchange.responded:
                respond_error(exchange, exc)

    # -- health and metadata ---------------------------------------------------
    async def health_live(self, exchange: HttpExchange, match: Match) -> None:
        exchange.respond(200 if self.service.is_live() else 400, [])

    async def health_ready(self, exchange: HttpExchange, match: Match) -> None:
        exchange.respond(200 if self.service.is_ready() else 400, [])

    async def server_metadata(self, exchange: HttpExchange, match: Match) -> None:
        respond_json(exchange, 200, self.service.server_metadata())

    async def model_metadata(self, exchange: HttpExchange, match: Match) -> None:
        meta = self.service.model_metadata(_model(match), parse_version(match.version))
        respond_json(exchange, 200, _metadata_json(meta))

    async def model_ready(self, exchange: HttpExchange, match: Match) -> None:
        if self.service.model_ready(_model(match), parse_version(match.version)):
            exchange.respond(200, [])
        else:
            respond_json(exchange, 400, {"error": "Model version not ready"})

    async def model_config(self, exchange: HttpExchange, match: Match) -> None:
        model = self.service.model(_model(match), parse_version(match.version))
        respond_json(exchange, 200, model.config_json)

    async def model_statistics(self, exchange: HttpExchange, match: Match) -> None:
        entries = self.service.model_statistics(match.model, parse_version(match.version))
        respond_json(exchange, 200, encode_statistics(entries))

    async def repository_index(self, exchange: HttpExchange, match: Match) -> None:
        body = _json_object(exchange.request.body, allow_empty=True)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("'ready' must be a boolean")
        rows = []
        for entry in self.service.repository_index(ready):
            row: dict[str, Any] = {"name": entry.name}
            if entry.version is not None:
                row["version"] = str(entry.version)
            row["state"] = entry.state.value
            row["reason"] = entry.reason
            rows.append(row)
        respond_json(exchange, 200, rows)

    async def model_load(self, exchange: HttpExchange, match: Match) -> None:
        body = _json_object(exchange.request.body, allow_empty=True)
        await self.service.load_model(_model(match), body.get("parameters") or {})
        exchange.respond(200, [])

    async def model_unload(self, exchange: HttpExchange, match: Match) -> None:
        body = _json_object(exchange.request.body, allow_empty=True)
        await self.service.unload_model(_model(match), body.get("parameters") or {})
        exchange.respond(200, [])

    # -- settings: GET returns them, POST updates them and returns the result -----
    async def log_settings(self, exchange: HttpExchange, match: Match) -> None:
        if exchange.request.method == "POST":
            changes = _json_object(exchange.request.body, allow_empty=True)
            respond_json(exchange, 200, self.service.update_log_settings(changes))
        else:
            respond_json(exchange, 200, self.service.log_settings())

    async def trace_settings(self, exchange: HttpExchange, match: Match) -> None:
        model = match.model  # None: the global settings
        if exchange.request.method == "POST":
            changes = _json_object(exchange.request.body, allow_empty=True)
            respond_json(exchange, 200, self.service.update_trace_settings(changes, model))
        else:
            respond_json(exchange, 200, self.service.trace_settings(model))

    # -- inference ---------------------------------------------------------------
    async def infer(self, exchange: HttpExchange, match: Match,
                    trace: tracing.FrontendTrace | None = None, sampled: bool = False) -> None:
        if not sampled and self.service.tracer.enabled:
            await self._traced(self.infer, exchange, match)
            return
        name = match.model if match.model is not None else _model(match)
        version = parse_version(match.version) if match.version else None
        # Before any of the body is looked at: a request for a model that cannot serve it
        # costs nothing, however big.
        model = self.service.model(name, version)
        headers = exchange.request.headers
        if "content-encoding" in headers:
            body = await self._unpacked_body(exchange)
            resolved = None  # awaited: the repository may have changed since
        else:
            body = exchange.request.body
            resolved = model
        size = len(body)
        header_text = headers.get("inference-header-content-length")
        header_length = None if header_text is None else _header_length(header_text, size)
        try:
            if size > offload.INLINE_BYTES:
                raise ReadOnLoop
            if header_length != 0:  # the usual request, decoded here and now
                request = codec.decode_infer_request(
                    body, header_length, model.name, version,
                    max_input_size=self.max_input_size, model=model,
                    shared_memory=self.shared_memory)
            else:
                request = self._decode_infer(body, header_length, model, version)
        except ReadOnLoop:  # a big body, or a big input in a shared-memory region
            request = await offload.run(self._decode_infer, body, header_length, model, version)
            resolved = None
        request.trace = trace
        if self.header_forward is not None:
            self.header_forward.apply(request, headers)
        try:
            # ``resolved``: no await since the model was looked up, so it is still the one.
            response = await self.service.infer(request, exchange.cancellation, resolved)
        except TritiumError:
            if exchange.disconnected:
                return
            raise
        if trace is not None:
            tracing.sending(trace, tracing.HTTP_EVENTS)
        accept = headers.get("accept-encoding")
        if offload.heavy_response(response):
            await _send_heavy(exchange, response, request, accept)
            return
        out_headers, parts = codec.encode_infer_response(response, request)
        if accept is not None:
            out_headers, parts = _compressed(out_headers, parts, accept)
        exchange.respond(200, out_headers, parts)

    async def _traced(self, endpoint: Callable[..., Awaitable[None]], exchange: HttpExchange,
                      match: Match) -> None:
        """``endpoint`` under a trace when the request is sampled (or carries a context)."""
        trace = tracing.begin(self.service.tracer, match.model or "",
                              exchange.request.headers, tracing.HTTP_EVENTS)
        if trace is None:
            await endpoint(exchange, match, None, True)
            return
        try:
            await endpoint(exchange, match, trace, True)
        finally:
            tracing.finish(trace, tracing.HTTP_EVENTS, exchange.responded)

    def _decode_infer(self, body: bytes | memoryview, header_length: int | None, model: ModelHandle,
                      version: int | None) -> InferenceRequest:
        if header_length != 0:
            return codec.decode_infer_request(
                body, header_length, model.name, version, max_input_size=self.max_input_size,
                model=model, shared_memory=self.shared_memory,
            )
        if len(model.inputs) != 1:
            raise invalid(
                "Raw binary request must only have 1 input, "
                f"model '{model.name}' has {len(model.inputs)}"
            )
        spec = next(iter(model.inputs.values()))
        return codec.decode_raw_binary_request(
            body, spec, model.max_batch_size > 0, model.name, version,
            max_input_size=self.max_input_size,
        )

    async def generate(self, exchange: HttpExchange, match: Match) -> None:
        request = await self._generate_request(exchange, match)
        trace = request.trace
        try:
            response = await self._run(exchange, request, self.service.generate)
            if response is None:
                return
            if trace is not None:
                tracing.sending(trace, tracing.HTTP_EVENTS)
            exchange.respond(200, JSON, await _coded(functools.partial(
                generate.encode_generate_response, response, request),
                offload.response_bytes(response)))
        finally:
            if trace is not None:
                tracing.finish(trace, tracing.HTTP_EVENTS, exchange.responded)

    async def generate_stream(self, exchange: HttpExchange, match: Match) -> None:
        request = await self._generate_request(exchange, match)
        trace = request.trace
        try:
            await self._generate_stream(exchange, request)
        finally:
            if trace is not None:
                tracing.finish(trace, tracing.HTTP_EVENTS, exchange.responded)

    async def _generate_stream(self, exchange: HttpExchange, request: InferenceRequest
                               ) -> None:
        stream = self.service.submit(request, exchange.cancellation)
        started = False
        async for response in stream:
            if exchange.disconnected:
                return
            if not started:
                status = 200 if response.error is None else http_status(response.error.code)
                exchange.start_stream(status, SSE)
                started = True
            if response.error is not None:
                exchange.write_chunk(generate.sse_error(response.error))
            elif not response.flag_only:
                exchange.write_chunk(generate.sse_event(
                    generate.encode_generate_response(response, request)))
            await exchange.wait_writable()
        exchange.end_stream()

    async def _generate_request(self, exchange: HttpExchange, match: Match
                                ) -> InferenceRequest:
        name, version = _model(match), parse_version(match.version)
        model = self.service.model(name, version)
        body = await self._unpacked_body(exchange)
        request = await _coded(functools.partial(
            generate.decode_generate_request, body, model, version,
            max_input_size=self.max_input_size), len(body))
        tracer = self.service.tracer
        if tracer.enabled:  # started once the request is decoded: nothing can fail before
            request.trace = tracing.begin(tracer, model.name, exchange.request.headers,
                                          tracing.HTTP_EVENTS)
        return request

    async def _unpacked_body(self, exchange: HttpExchange) -> bytes | memoryview:
        """The body, decompressed off the event loop unless it is small."""
        request = exchange.request
        if request.headers.get("content-encoding") is None:
            return request.body
        return await _coded(functools.partial(self._body, exchange),
                            _INFLATE_RATIO * len(request.body))

    def _body(self, exchange: HttpExchange) -> bytes | memoryview:
        request = exchange.request
        encoding = request.headers.get("content-encoding")
        if encoding is None:
            return request.body
        return compression.decompress_body(request.body, encoding, self.max_input_size)

    async def _run(self, exchange: HttpExchange, request: InferenceRequest,
                   call: Callable[[InferenceRequest, Cancellation], Any]) -> Any:
        """Run a single-response call under the exchange's cancellation: a client that
        leaves cancels it."""
        try:
            return await call(request, exchange.cancellation)
        except TritiumError:
            if exchange.disconnected:
                return None
            raise


# Compressed bodies are weighed as if this much bigger: the work is in inflating them.
_INFLATE_RATIO = 64


async def _coded(work: Callable[[], T], size: int) -> T:
    """``work()``, a decode or encode of about ``size`` bytes: inline when small, on a
    codec thread otherwise, so that a big one never holds the event loop."""
    if offload.heavy(size):
        return await offload.run(work)
    return work()


def _compressed(headers: list[tuple[str, str]], parts: list[BodyPart],
                accept_encoding: str | None) -> tuple[list[tuple[str, str]], list[BodyPart]]:
    encoding, parts = compression.compress_response(parts, accept_encoding)
    if encoding is not None:
        headers = [*headers, ("Content-Encoding", encoding)]
    return headers, parts


# Pieces of a streamed body gathered into one chunk; with the transport's write buffer,
# what a streamed response holds at once.
_CHUNK_BYTES = 1 << 20


async def _send_pieces(exchange: HttpExchange, headers: list[tuple[str, str]],
                       pieces: Iterator[BodyPart]) -> None:
    """A body made as it is sent (chunked, uncompressed), each chunk on a codec thread, at
    the pace the client reads it."""
    exchange.start_stream(200, headers)
    while not exchange.disconnected:
        chunk = await offload.run(_gather, pieces)
        if not chunk:
            exchange.end_stream()
            return
        exchange.write_chunk(chunk)
        await exchange.wait_writable()


def _gather(pieces: Iterator[BodyPart]) -> bytes:
    gathered: list[BodyPart] = []
    size = 0
    for piece in pieces:
        gathered.append(piece)
        size += len(piece)
        if size >= _CHUNK_BYTES:
            break
    return b"".join(gathered)


def _model(match: Match) -> str:
    if match.model is None:
        raise NoRoute(404, "Not Found")
    return match.model


def _header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise invalid(f"invalid Inference-Header-Content-Length '{value}'") from None
    if length < 0 or length > body_length:
        raise invalid(
            f"Inference-Header-Content-Length {length} must be between 0 and the body "
            f"length {body_length}"
        )
    return length


def _json_object(body: bytes | memoryview, allow_empty: bool) -> dict[str, Any]:
    if not body and allow_empty:
        return {}
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON: {exc}") from None
    if not isinstance(value, dict):
        raise invalid("the request body must be a JSON object")
    return value


def _metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    def tensors(items: list[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in items]

    return {
        "name": meta.name,
        "versions": meta.versions,
        "platform": meta.platform,
        "inputs": tensors(meta.inputs),
        "outputs": tensors(meta.outputs),
    }


Endpoint = Callable[[HttpApi, HttpExchange, Match], Awaitable[None]]

ROUTES: tuple[tuple[str, str, Endpoint], ...] = (
    ("GET", "/v2/health/live", HttpApi.health_live),
    ("GET", "/v2/health/ready", HttpApi.health_ready),
    ("GET", "/v2", HttpApi.server_metadata),
    ("POST", "/v2/repository/index", HttpApi.repository_index),
    ("POST", "/v2/repository/models/{model}/load", HttpApi.model_load),
    ("POST", "/v2/repository/models/{model}/unload", HttpApi.model_unload),
    ("GET", "/v2/models/stats", HttpApi.model_statistics),
    ("GET", "/v2/models/{model}", HttpApi.model_metadata),
    ("GET", "/v2/models/{model}/ready", HttpApi.model_ready),
    ("GET", "/v2/models/{model}/config", HttpApi.model_config),
    ("GET", "/v2/models/{model}/stats", HttpApi.model_statistics),
    ("POST", "/v2/models/{model}/infer", HttpApi.infer),
    ("POST", "/v2/models/{model}/generate", HttpApi.generate),
    ("POST", "/v2/models/{model}/generate_stream", HttpApi.generate_stream),
    ("GET", "/v2/logging", HttpApi.log_settings),
    ("POST", "/v2/logging", HttpApi.log_settings),
    ("GET", "/v2/trace/setting", HttpApi.trace_settings),
    ("POST", "/v2/trace/setting", HttpApi.trace_settings),
    ("GET", "/v2/models/{model}/trace/setting", HttpApi.trace_settings),
    ("POST", "/v2/models/{model}/trace/setting", HttpApi.trace_settings),
    *(("GET", f"/v2/{kind}sharedmemory{region}/status", status)
      for kind, status in (("system", shm.system_status), ("cuda", shm.cuda_status))
      for region in ("", "/region/{model}")),
    *(("POST", f"/v2/{kind}sharedmemory{region}/{action}", endpoint)
      for kind, action, endpoint in (("system", "register", shm.system_register),
                                     ("system", "unregister", shm.system_unregister),
                                     ("cuda", "register", shm.cuda_register),
                                     ("cuda", "unregister", shm.cuda_unregister))
      for region in ("", "/region/{model}")),
    # OpenAI's API over the same models (frontends/http/openai).
    ("GET", "/v1/models", openai.list_models),
    ("GET", "/v1/models/{model}", openai.retrieve_model),
    ("POST", "/v1/completions", openai.completions),
    ("POST", "/v1/chat/completions", openai.chat_completions),
)


async def _send_heavy(exchange: HttpExchange, response: InferenceResponse,
                      request: InferenceRequest, accept: str | None) -> None:
    """A big /infer response, encoded on a codec thread and sent whole or in pieces."""
    out_headers, stream = await offload.run(codec.stream_infer_response, response, request)
    if isinstance(stream, list):
        exchange.respond(200, *await offload.run(_compressed, out_headers, stream, accept))
    else:
        await _send_pieces(exchange, out_headers, stream)
