"""The Anthropic routes: POST /v1/messages and /v1/messages/count_tokens over the served models' chat serving,
errors in Anthropic's shape. With --api-key, Anthropic's clients send it as `x-api-key` (accepted on these
routes beside `Authorization: Bearer`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tokenmill.entrypoints.anthropic.messages import (AnthropicMessages, CountTokensRequest, MessagesRequest,
                                                      anthropic_error_body)
from tokenmill.entrypoints.openai.router import chat_serving
from tokenmill.entrypoints.openai.serving_engine import model_not_found
from tokenmill.entrypoints.server.app import ServerContext
from tokenmill.entrypoints.server.errors import APIError
from tokenmill.entrypoints.server.loaded_model import LoadedModel
from tokenmill.entrypoints.server.model_pool import UnknownModelError

PREFIX = "/v1/messages"


def build_router(ctx: ServerContext) -> APIRouter:
    pool = ctx.pool
    ctx.error_shapes.add(PREFIX, anthropic_error_body)
    ctx.x_api_key_paths.add(PREFIX)
    router = APIRouter()

    def not_found(e: UnknownModelError) -> APIError:
        return model_not_found(e.requested, e.served)

    def messages_of(m: LoadedModel) -> AnthropicMessages:
        return AnthropicMessages(chat_serving(ctx, m))

    @router.post(PREFIX)
    async def create_message(req: MessagesRequest, raw_request: Request) -> Any:
        """Anthropic's Messages API, answered by the chat path (anthropic/messages.py)."""
        lease = await pool.lease(req.model, not_found)
        return await lease.answer(lambda m: messages_of(m).create(req, raw_request))

    @router.post(PREFIX + "/count_tokens")
    async def count_tokens(req: CountTokensRequest) -> dict[str, int]:
        """The prompt a Messages request would render, counted."""
        lease = await pool.lease(req.model, not_found)
        return await lease.answer(lambda m: messages_of(m).count_tokens(req))  # type: ignore[no-any-return]

    return router
