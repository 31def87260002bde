"""/v1 endpoints, served by the HTTP transport beside /v2: the exchange's cancellation goes
with every request, so a client that closes its connection cancels the model's work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tritium.core.errors import TritiumError
from tritium.core.llm_statistics import OUTCOMES, GenerationTimer
from tritium.core.model import ModelHandle
from tritium.core.response import ResponseStream
from tritium.core.service import InferenceService
from tritium.frontends.http.exchange import HttpExchange
from tritium.frontends.http.openai.chat import ChatTemplates, messages_of
from tritium.frontends.http.openai.errors import OpenAIError, from_tritium, model_not_found
from tritium.frontends.http.openai.mapping import TextDecoder, Usage, build_request
from tritium.frontends.http.openai.params import Params, common_params, parse_body, prompt_of
from tritium.frontends.http.openai.replies import DONE_EVENT, Reply, model_object, sse
from tritium.frontends.http.routes import Match

if TYPE_CHECKING:
    from tritium.frontends.http.handlers import HttpApi

JSON = [("Content-Type", "application/json")]
SSE = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
# A client may name its request (as vLLM's server allows): the id the model and the logs see.
REQUEST_ID_HEADER = "x-request-id"
TEMPLATES = ChatTemplates()
# Outcomes a request is counted under (core.llm_statistics.OUTCOMES).
SUCCESS, ERROR, CANCELLED = OUTCOMES


def _respond(exchange: HttpExchange, status: int, body: bytes) -> None:
    exchange.respond(status, JSON, body)


def _fail(exchange: HttpExchange, error: OpenAIError) -> None:
    if not exchange.responded and not exchange.disconnected:
        _respond(exchange, error.status, error.body())


def _ready_model(service: InferenceService, name: str) -> ModelHandle:
    try:
        return service.model(name)
    except TritiumError:
        raise model_not_found(name) from None


async def list_models(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    names = sorted({entry.name for entry in api.service.repository_index(ready_only=True)})
    _respond(exchange, 200, orjson.dumps(
        {"object": "list", "data": [model_object(name) for name in names]}))


async def retrieve_model(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    name = match.model or ""
    if not api.service.model_ready(name):
        _fail(exchange, model_not_found(name))
        return
    _respond(exchange, 200, orjson.dumps(model_object(name)))


async def completions(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    await _serve(api, exchange, chat=False)


async def chat_completions(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    await _serve(api, exchange, chat=True)


async def _serve(api: HttpApi, exchange: HttpExchange, chat: bool) -> None:
    try:
        doc = parse_body(await api._unpacked_body(exchange))
        params, model, prompt = _prompt(api.service, doc, chat)
        reply = Reply(params.model, chat, params.include_usage)
        request_id = exchange.request.headers.get(REQUEST_ID_HEADER) or reply.id
        request = build_request(model, prompt, params, request_id)
        timer = model.statistics().generation.request(
            "chat_completions" if chat else "completions")
        try:
            stream = api.service.submit(request, exchange.cancellation)
            answer = _stream if params.stream else _whole
            outcome, usage = await answer(exchange, stream, reply, params, timer)
        except BaseException:
            timer.finish(CANCELLED if exchange.disconnected else ERROR)
            raise
        tokens = usage.completion_tokens if usage.reported else timer.steps
        timer.finish(outcome, usage.prompt_tokens or 0, tokens)
    except OpenAIError as exc:
        _fail(exchange, exc)
    except TritiumError as exc:
        _fail(exchange, from_tritium(exc))


def _prompt(service: InferenceService, doc: dict[str, Any], chat: bool
            ) -> tuple[Params, ModelHandle, str]:
    """Checked parameters, the model, and the prompt: a chat's is its rendered messages."""
    if not chat:
        params = common_params(doc, ("max_tokens",))
        prompt = prompt_of(doc)
        return params, _ready_model(service, params.model), prompt
    # A chat's limit is max_completion_tokens; max_tokens is its deprecated name.
    params = common_params(doc, ("max_completion_tokens", "max_tokens"))
    messages = messages_of(doc)
    model = _ready_model(service, params.model)
    return params, model, TEMPLATES.for_model(model).render(messages)


async def _whole(exchange: HttpExchange, stream: ResponseStream, reply: Reply,
                 params: Params, timer: GenerationTimer) -> tuple[str, Usage]:
    """All of the model's responses, their text joined into one answer."""
    decoder, usage, parts = TextDecoder(), Usage(), []
    async for response in stream:
        if response.error is not None:
            if exchange.disconnected:
                return CANCELLED, usage  # cancelled because the client left: nobody to answer
            raise response.error
        if not response.flag_only:
            timer.step()
            parts.append(decoder.text(response))
            usage.add(response)
    parts.append(decoder.rest())
    _respond(exchange, 200, reply.whole("".join(parts), usage.finish_reason(params.max_tokens),
                                        usage.object()))
    return SUCCESS, usage


async def _stream(exchange: HttpExchange, stream: ResponseStream, reply: Reply,
                  params: Params, timer: GenerationTimer) -> tuple[str, Usage]:
    """Each response as it comes, as server-sent events, ended by ``data: [DONE]``. The
    head waits for the first response, so an error before any text gets its status."""
    decoder, usage, started = TextDecoder(), Usage(), False
    async for response in stream:
        if exchange.disconnected:
            return CANCELLED, usage
        if response.error is not None:
            if not started:
                raise response.error
            exchange.write_chunk(sse({"error": from_tritium(response.error).object()}))
            exchange.end_stream()
            return ERROR, usage
        if not started:
            _start(exchange, reply)
            started = True
        if not response.flag_only:
            timer.step()
            usage.add(response)
            text = decoder.text(response)
            if text:
                exchange.write_chunk(reply.chunk(text))
        await exchange.wait_writable()
    if not started:
        _start(exchange, reply)
    rest = decoder.rest()
    if rest:
        exchange.write_chunk(reply.chunk(rest))
    exchange.write_chunk(reply.chunk(None, usage.finish_reason(params.max_tokens)))
    if reply.include_usage:
        exchange.write_chunk(reply.usage_chunk(usage.object()))
    exchange.write_chunk(DONE_EVENT)
    exchange.end_stream()
    return SUCCESS, usage


def _start(exchange: HttpExchange, reply: Reply) -> None:
    exchange.start_stream(200, SSE)
    if reply.chat:  # OpenAI's first chat event names the role, with empty content
        exchange.write_chunk(reply.chunk("", role=True))
