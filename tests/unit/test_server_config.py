"""ServerConfig from the `serve` flags, and the protocol-neutral app factory with routers of its own."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest
from fastapi import APIRouter

from tokenmill.cli import build_parser
from tokenmill.engine.async_engine import DEFAULT_WATCHDOG_TIMEOUT, AsyncEngine
from tokenmill.entrypoints.server.app import ServerContext, build_app
from tokenmill.entrypoints.server.config import DEFAULT_MAX_REQUEST_BYTES, ServerConfig


def config_of(*flags: str) -> ServerConfig:
    return ServerConfig.from_args(build_parser().parse_args(["serve", *flags]))


def test_the_defaults_are_the_flags_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENMILL_API_KEY", raising=False)
    assert config_of() == ServerConfig()
    assert ServerConfig().max_request_bytes == DEFAULT_MAX_REQUEST_BYTES
    assert ServerConfig().watchdog_timeout == DEFAULT_WATCHDOG_TIMEOUT and ServerConfig().host == "127.0.0.1"


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENMILL_API_KEY", "from-env")
    c = config_of("--port", "9000", "--cors-origins", "http://a, http://b,", "--max-request-bytes", "0",
                  "--watchdog-timeout", "0", "--request-timeout", "2.5", "--served-model-name", "m")
    assert (c.port, c.cors_origins, c.max_request_bytes, c.watchdog_timeout) == (9000, ("http://a", "http://b"), None,
                                                                                 None)
    assert c.request_timeout == 2.5 and c.served_model_name == "m" and c.api_key == "from-env"
    assert config_of("--api-key", "given").api_key == "given"
    assert config_of("--watchdog-timeout", "5").watchdog_timeout == 5.0
    # vLLM's form: more names after the first are aliases
    c = config_of("--served-model-name", "m", "gpt-4o", "gpt-4o-mini")
    assert c.served_model_name == "m" and c.served_model_aliases == ("gpt-4o", "gpt-4o-mini")


def test_a_model_written_after_served_model_name_is_not_taken_as_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenmill import cli

    assert cli.main(["serve", "--served-model-name", "m", "default"]) == 2
    assert "put the model before the flag" in capsys.readouterr().err


def test_frozen_and_checked() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ServerConfig().port = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="watchdog_timeout must be above 0"):
        ServerConfig(watchdog_timeout=0)


class _StandInEngine:
    model_name = "stand-in"

    def has_unfinished_requests(self) -> bool:
        return False

    def stats(self) -> dict[str, float]:
        return dict.fromkeys(("num_running", "num_waiting", "kv_cache_usage", "num_preemptions",
                              "prefix_cache_queries", "prefix_cache_hits"), 0.0)


def test_the_app_factory_mounts_only_the_routers_it_is_given() -> None:
    engine = _StandInEngine()
    async_engine = AsyncEngine(lambda: engine)  # type: ignore[arg-type,return-value]
    async_engine.wait_loaded()
    seen: list[ServerContext] = []

    def hello_router(ctx: ServerContext) -> APIRouter:
        seen.append(ctx)
        router = APIRouter()

        @router.get("/hello")
        async def hello() -> dict[str, Any]:
            return {"model": ctx.served_model_name}

        return router

    app = build_app(async_engine, ServerConfig(api_key="k"), routers=[hello_router])

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            key = {"Authorization": "Bearer k"}
            return [await client.get("/health"), await client.get("/hello"), await client.get("/hello", headers=key),
                    await client.post("/v1/completions", json={"prompt": "hi"}, headers=key),
                    await client.get("/metrics")]

    try:
        health, no_key, hello, completions, metrics = asyncio.run(main())
    finally:
        async_engine.shutdown()
    assert health.status_code == 200 and metrics.status_code == 200
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == 401  # the middleware guards routers too
    assert hello.json() == {"model": "stand-in"} and seen[0].config.api_key == "k"
    assert completions.status_code == 404  # no OpenAI router mounted
