"""The OpenAI app around an in-process engine, called through httpx's ASGI transport (no sockets): for
tests of request validation and answers, where neither a process nor real streaming hang-ups matter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx


def in_process_app(server: Any = None, **config: Any) -> Iterator[Any]:
    """For a fixture: `yield from in_process_app(max_model_len=256, ...)` yields the app (EngineConfig
    fields as keywords), then checks that the engine is still alive and shuts it down. `server`: a
    ServerConfig, served with the Ollama routes beside the OpenAI ones (as `tokenmill serve` does)."""
    from tokenmill.config import EngineConfig
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.entrypoints.ollama import router as ollama_router
    from tokenmill.entrypoints.openai import router as openai_router
    from tokenmill.entrypoints.openai.api_server import build_app
    from tokenmill.entrypoints.server import app as server_app

    async_engine = AsyncEngine(LLMEngine(EngineConfig(**config), progress=False))
    if server is None:
        yield build_app(async_engine, log_requests=False)
    else:
        yield server_app.build_app(async_engine, server, routers=[openai_router.build_router, ollama_router.build_router])
    assert not async_engine.is_dead, async_engine.dead_reason
    async_engine.shutdown()


def call(app: Any, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120,
         headers: dict[str, str] | None = None) -> httpx.Response:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=timeout) as client:
            return await client.request(method, path, json=body, headers=headers)

    return asyncio.run(main())
