"""/v1 endpoints, served by the HTTP transport beside /v2: the exchange's cancellation goes
with every request, so a client that closes its connection cancels the model's work."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tritium.core import offload, tracing
from tritium.core.errors import TritiumError
from tritium.core.llm_statistics import OUTCOMES, GenerationTimer
from tritium.core.model import ModelHandle
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.service import InferenceService
from tritium.frontends.http.exchange import HttpExchange
from tritium.frontends.http.openai.chat import ChatTemplates, messages_of
from tritium.frontends.http.openai.errors import OpenAIError, from_tritium, model_not_found
from tritium.frontends.http.openai.mapping import TextDecoder, Usage, build_request
from tritium.frontends.http.openai.params import Params, common_params, parse_body, prompt_of
from tritium.frontends.http.openai.replies import DONE_EVENT, Reply, model_object, sse
from tritium.frontends.http.openai.tokenizer import Tokenizers, count_tokens
from tritium.frontends.http.routes import Match

if TYPE_CHECKING:
    from tritium.frontends.http.handlers import HttpApi

JSON = [("Content-Type", "application/json")]
SSE = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
# A client may name its request (as vLLM's server allows): the id the model and the logs see.
REQUEST_ID_HEADER = "x-request-id"
TEMPLATES = ChatTemplates()
TOKENIZERS = Tokenizers()
# Outcomes a request is counted under (core.llm_statistics.OUTCOMES).
SUCCESS, ERROR, CANCELLED = OUTCOMES


def _respond(exchange: HttpExchange, status: int, body: bytes) -> None:
    exchange.respond(status, JSON, body)


def _fail(exchange: HttpExchange, error: OpenAIError) -> None:
    if not exchange.responded and not exchange.disconnected:
        _respond(exchange, error.status, error.body())


def route_error(status: int, message: str) -> bytes:
    """No such /v1 endpoint (or method), in OpenAI's error shape."""
    return OpenAIError(status, message).body()


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


@dataclass(slots=True)
class Job:
    """One OpenAI request on its way: what answers it, counts it and times it."""

    reply: Reply
    params: Params
    prompt: str
    timer: GenerationTimer
    tokenizer: Any | None  # counts usage when the model reports no token counts
    usage: Usage = field(default_factory=Usage)
    # The answer's text, kept for the tokenizer to count.
    parts: list[str] = field(default_factory=list)

    def add(self, response: InferenceResponse, text: str) -> None:
        self.timer.step()
        self.usage.add(response)
        if self.tokenizer is not None:
            self.parts.append(text)

    async def count_usage(self) -> None:
        if self.tokenizer is None or self.usage.reported:
            return
        # A chat prompt got its special tokens (BOS) from the template already.
        prompt = await count_tokens(self.tokenizer, self.prompt, not self.reply.chat)
        completion = await count_tokens(self.tokenizer, "".join(self.parts), False)
        self.usage.counted(prompt, completion)

    def finish_reason(self) -> str:
        return self.usage.finish_reason(self.params.max_tokens)


async def _serve(api: HttpApi, exchange: HttpExchange, chat: bool) -> None:
    try:
        params, model, prompt = await _prompt(api, exchange, chat)
        reply = Reply(params.model, chat, params.include_usage)
        request_id = exchange.request.headers.get(REQUEST_ID_HEADER) or reply.id
        request = build_request(model, prompt, params, request_id)
        job = Job(reply, params, prompt, model.statistics().generation.request(
            "chat_completions" if chat else "completions"),
            TOKENIZERS.for_model(model, api.tokenizer_dir))
        tracer = api.service.tracer
        request.trace = trace = tracing.begin(
            tracer, model.name, exchange.request.headers, tracing.HTTP_EVENTS) \
            if tracer.enabled else None
        try:
            stream = api.service.submit(request, exchange.cancellation)
            answer = _stream if params.stream else _whole
            outcome = await answer(exchange, stream, job)
        except BaseException:
            job.timer.finish(CANCELLED if exchange.disconnected else ERROR)
            raise
        finally:
            if trace is not None:
                tracing.finish(trace, tracing.HTTP_EVENTS, exchange.responded)
        usage = job.usage
        tokens = usage.completion_tokens if usage.reported else job.timer.steps
        job.timer.finish(outcome, usage.prompt_tokens or 0, tokens)
    except OpenAIError as exc:
        _fail(exchange, exc)
    except TritiumError as exc:
        _fail(exchange, from_tritium(exc))


async def _prompt(api: HttpApi, exchange: HttpExchange, chat: bool
                  ) -> tuple[Params, ModelHandle, str]:
    """Checked parameters, the model, and the prompt: a chat's is its rendered messages.

    Parsing, checking and rendering grow with the body: past a few hundred KiB they run on
    a codec thread (the parse in pieces), so a huge chat never holds the event loop."""
    body = await api._unpacked_body(exchange)
    heavy = offload.heavy(len(body))
    read = functools.partial(read_body, body, chat)
    params, content = await offload.run(read) if heavy else read()
    model = _ready_model(api.service, params.model)
    if not chat:
        assert isinstance(content, str)
        return params, model, content
    assert isinstance(content, list)
    render = functools.partial(TEMPLATES.for_model(model, api.tokenizer_dir).render, content)
    return params, model, await offload.run(render) if heavy else render()


def read_body(body: bytes | memoryview, chat: bool) -> tuple[Params, str | list[dict[str, Any]]]:
    """The parameters and the prompt (a completion) or the messages (a chat) of a body."""
    doc = parse_body(body)
    if not chat:
        return common_params(doc, ("max_tokens",)), prompt_of(doc)
    # A chat's limit is max_completion_tokens; max_tokens is its deprecated name.
    return common_params(doc, ("max_completion_tokens", "max_tokens")), messages_of(doc)


async def _whole(exchange: HttpExchange, stream: ResponseStream, job: Job) -> str:
    """All of the model's responses, their text joined into one answer."""
    decoder, parts = TextDecoder(), []
    async for response in stream:
        if response.error is not None:
            if exchange.disconnected:
                return CANCELLED  # cancelled because the client left: nobody to answer
            raise response.error
        if not response.flag_only:
            text = decoder.text(response)
            parts.append(text)
            job.add(response, text)
    parts.append(decoder.rest())
    job.parts = parts
    await job.count_usage()
    _respond(exchange, 200, job.reply.whole("".join(parts), job.finish_reason(),
                                            job.usage.object()))
    return SUCCESS


async def _stream(exchange: HttpExchange, stream: ResponseStream, job: Job) -> str:
    """Each response as it comes, as server-sent events, ended by ``data: [DONE]``. The
    head waits for the first response, so an error before any text gets its status."""
    decoder, started, reply = TextDecoder(), False, job.reply
    async for response in stream:
        if exchange.disconnected:
            return CANCELLED
        if response.error is not None:
            if not started:
                raise response.error
            exchange.write_chunk(sse({"error": from_tritium(response.error).object()}))
            exchange.end_stream()
            return ERROR
        if not started:
            _start(exchange, reply)
            started = True
        if not response.flag_only:
            text = decoder.text(response)
            job.add(response, text)
            if text:
                exchange.write_chunk(reply.chunk(text))
        await exchange.wait_writable()
    if not started:
        _start(exchange, reply)
    rest = decoder.rest()
    if rest:
        job.parts.append(rest)
        exchange.write_chunk(reply.chunk(rest))
    await job.count_usage()
    exchange.write_chunk(reply.chunk(None, job.finish_reason()))
    if reply.include_usage:
        exchange.write_chunk(reply.usage_chunk(job.usage.object()))
    exchange.write_chunk(DONE_EVENT)
    exchange.end_stream()
    return SUCCESS


def _start(exchange: HttpExchange, reply: Reply) -> None:
    exchange.start_stream(200, SSE)
    if reply.chat:  # OpenAI's first chat event names the role, with empty content
        exchange.write_chunk(reply.chunk("", role=True))
