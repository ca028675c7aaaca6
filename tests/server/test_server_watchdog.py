"""In-process: an engine thread that hangs (a step hook blocks on an Event, so the hang is certain
whatever the machine's speed) turns /health to 503, fails the in-flight requests with a clear error, and
refuses new ones."""

from __future__ import annotations

import asyncio
import threading

import httpx


def test_a_hung_engine_turns_health_to_503_and_fails_the_waiting_requests() -> None:
    from tokenmill.config import EngineConfig
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.entrypoints.openai.api_server import build_app

    engine = LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory=32 * 2**20), progress=False)
    deaths: list[BaseException] = []
    async_engine = AsyncEngine(engine, on_death=deaths.append, watchdog_timeout=0.5)
    release = threading.Event()
    async_engine.step_hooks.insert(0, lambda _: release.wait())  # the first step never completes
    app = build_app(async_engine, log_requests=False)
    body = {"prompt": "Once upon a time", "max_tokens": 20, "ignore_eos": True}

    async def main() -> tuple[httpx.Response, ...]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=60) as client:
            before = await client.get("/health")
            plain, streamed = await asyncio.gather(client.post("/v1/completions", json=body),
                                                   client.post("/v1/completions", json={**body, "stream": True}))
            health = await client.get("/health")
            after = await client.post("/v1/completions", json=body)
            return before, plain, streamed, health, after

    try:
        before, plain, streamed, health, after = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        release.set()
        async_engine.shutdown()
    assert before.status_code == 200
    assert plain.status_code == 500 and "made no progress" in plain.json()["error"]["message"], plain.text
    assert streamed.status_code == 200 and "made no progress" in streamed.text and "data: [DONE]" in streamed.text
    assert health.status_code == 503 and "made no progress" in health.json()["error"]["message"]
    assert after.status_code == 503 and after.json()["error"]["code"] == 503
    assert len(deaths) == 1
