"""The OpenAI-compatible routes, as one APIRouter: /v1/models, /v1/completions, /v1/chat/completions, and
vLLM's /tokenize and /detokenize. Routes only parse and delegate to the serving classes."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request

from tokenmill.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                                   CompletionResponse, DetokenizeRequest, DetokenizeResponse,
                                                   ModelCard, ModelList, ResponsesRequest, TokenizeRequest,
                                                   TokenizeResponse)
from tokenmill.entrypoints.openai.serving_chat import OpenAIServingChat
from tokenmill.entrypoints.openai.serving_completion import OpenAIServingCompletion
from tokenmill.entrypoints.openai.serving_responses import OpenAIServingResponses
from tokenmill.entrypoints.openai.serving_engine import model_not_found
from tokenmill.entrypoints.server.app import ServerContext
from tokenmill.entrypoints.server.errors import APIError, bad_request
from tokenmill.entrypoints.server.loaded_model import LoadedModel
from tokenmill.entrypoints.server.model_pool import UnknownModelError

log = logging.getLogger("tokenmill.server")

DESCRIPTION = "An OpenAI-compatible LLM inference server."
# A streamed answer: server-sent events, each a `data:` line holding one JSON chunk (the response model's
# streaming form), the last one `[DONE]`. `itemSchema` (OpenAPI 3.2's field for sequential media types)
# describes one event as SSE parsers hand it over; a plain `schema` would, before 3.2, describe each event
# too, and `{"type": "string"}` there does not fit the event objects validators read (schemathesis >= 4.3x).
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string", "description": "one JSON chunk, or [DONE] at the end"},
                             "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}
_STREAM: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {"itemSchema": _SSE_EVENT}}}}


def chat_serving(ctx: ServerContext, m: LoadedModel) -> OpenAIServingChat:
    """Model m's chat serving, made once per loaded model and shared by every front end that answers through
    chat (OpenAI's chat and Responses, Anthropic's Messages); a template problem is logged when it is made."""
    def make(m: LoadedModel) -> OpenAIServingChat:
        chat = OpenAIServingChat(m.async_engine, m.name, ctx.metrics.model(m.name), ctx.state,
                                 ctx.config.max_waiting_requests, tool_call_parser=ctx.config.tool_call_parser,
                                 reasoning_parser=ctx.config.reasoning_parser, accepts=ctx.pool.accepts(m.name),
                                 request_timeout=ctx.config.request_timeout, log_prompts=ctx.config.log_prompts,
                                 served_names=ctx.pool.names)
        template_problem = chat.check_template()
        if template_problem:
            log.error("%s: %s", m.name, template_problem)
        return chat
    return m.serving("openai.chat", make)


def build_router(ctx: ServerContext) -> APIRouter:
    """The OpenAI routes over `ctx`'s models, sharing the app's state and metrics. Each request leases the
    model its `model` names (none: the default) from the pool; each model has its own serving objects."""
    pool = ctx.pool
    options: dict[str, Any] = {"request_timeout": ctx.config.request_timeout, "log_prompts": ctx.config.log_prompts,
                               "served_names": pool.names}

    def completions_of(m: LoadedModel) -> OpenAIServingCompletion:
        return m.serving("openai.completions", lambda m: OpenAIServingCompletion(
            m.async_engine, m.name, ctx.metrics.model(m.name), ctx.state, ctx.config.max_waiting_requests,
            accepts=pool.accepts(m.name), **options))

    def chat_of(m: LoadedModel) -> OpenAIServingChat:
        return chat_serving(ctx, m)

    def not_found(e: UnknownModelError) -> APIError:
        return model_not_found(e.requested, e.served)

    for m in pool.loaded:  # what a model loaded at start has to say about its template, said at start
        chat_of(m)
    created = int(time.time())
    router = APIRouter()

    def card(name: str) -> ModelCard:
        served = pool.served(name)
        return ModelCard(id=name, created=created, root=served.source.name, max_model_len=served.max_model_len)

    @router.get("/v1/models")
    async def models() -> ModelList:
        """Every served model, loaded or not."""
        return ModelList(data=[card(name) for name in pool.names])

    @router.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> ModelCard:
        """One served model (OpenAI's retrieve: `client.models.retrieve(name)`; Ollama answers it too), by any
        name a request's `model` may use; vLLM's 404 for another."""
        try:
            return card(pool.resolve(model))
        except UnknownModelError as e:
            raise not_found(e) from None

    @router.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        async def run(m: LoadedModel) -> TokenizeResponse:
            completions, chat = completions_of(m), chat_of(m)
            if (req.prompt is None) == (req.messages is None):
                raise bad_request("give exactly one of prompt and messages", "prompt")
            if req.tools is not None and req.messages is None:
                raise bad_request("tools go with messages", "tools")
            if req.chat_template_kwargs is not None and req.messages is None:
                raise bad_request("chat_template_kwargs go with messages", "chat_template_kwargs")
            if req.messages is not None:
                ids = await chat.render(req.messages, req.add_generation_prompt, req.continue_final_message,
                                        chat.tool_calling(req.tools), req.chat_template_kwargs)
            else:
                ids = await completions.encode(req.prompt or "", req.add_special_tokens is not False)
            tokenizer = completions.tokenizer
            strs = [tokenizer.id_to_token(t) for t in ids] if req.return_token_strs else None
            return TokenizeResponse(count=len(ids), max_model_len=completions.max_model_len, tokens=ids,
                                    token_strs=strs)
        return await (await pool.lease(req.model, not_found)).answer(run)

    @router.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> DetokenizeResponse:
        async def run(m: LoadedModel) -> DetokenizeResponse:
            completions = completions_of(m)
            vocab = completions.vocab_size
            bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"tokens: token id {bad} is out of range [0, {vocab})", "tokens")
            return DetokenizeResponse(prompt=await asyncio.to_thread(completions.tokenizer.decode, req.tokens))
        return await (await pool.lease(req.model, not_found)).answer(run)

    @router.post("/v1/completions", response_model=CompletionResponse, responses=_STREAM)
    async def create_completion(req: CompletionRequest, raw_request: Request) -> Any:
        lease = await pool.lease(req.model, not_found)
        return await lease.answer(lambda m: completions_of(m).create_completion(req, raw_request))

    @router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_STREAM)
    async def create_chat_completion(req: ChatCompletionRequest, raw_request: Request) -> Any:
        lease = await pool.lease(req.model, not_found)
        return await lease.answer(lambda m: chat_of(m).create_chat_completion(req, raw_request))

    @router.post("/v1/responses", responses=_STREAM)
    async def create_response(req: ResponsesRequest, raw_request: Request) -> Any:
        """OpenAI's Responses API, answered by the chat path (serving_responses.py)."""
        lease = await pool.lease(req.model, not_found)
        return await lease.answer(lambda m: OpenAIServingResponses(chat_of(m)).create(req, raw_request))

    @router.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"], include_in_schema=False)
    @router.post("/v1/responses/{response_id}/cancel", include_in_schema=False)
    async def stored_response(response_id: str) -> Any:
        raise APIError(404, f"Response {response_id!r} not found: this server stores no responses (every answer "
                            "says store: false); send the whole conversation in `input`", "response_id")

    @router.post("/v1/embeddings", include_in_schema=False)
    async def embeddings() -> Any:
        # vLLM's answer for a generative model: clients that try (RAG front ends) hear why, not a bare 404
        raise bad_request(f"The model `{pool.default_name}` does not support Embeddings API: tokenmill serves generative "
                          "models (completions and chat) only", "model")

    # llama-server and Ollama also answer without the /v1 prefix: an openai client pointed at
    # http://host:port (a common slip) then works instead of getting 404s
    for alias, endpoint in (("/models", models), ("/models/{model:path}", retrieve_model),
                            ("/completions", create_completion),
                            ("/chat/completions", create_chat_completion), ("/responses", create_response),
                            ("/embeddings", embeddings)):
        methods = ["GET"] if alias.startswith("/models") else ["POST"]
        router.add_api_route(alias, endpoint, methods=methods, include_in_schema=False)
    return router
