"""A preemption storm: 64 concurrent requests against a KV cache of 41 blocks, where about ten fit at once.

Every request must finish (none waits forever), each greedy output must equal the one from the shared
server's ample cache, the preemption counter must have moved, and afterwards nothing may hold a block.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from app_server import AppServer
from conftest import API_KEY
from server_process import ServerProcess

from tokenmill.benchmarks.soak import server_gauges
from tokenmill.config import EngineConfig

NUM_REQUESTS, MAX_TOKENS = 64, 32
# 720 KiB per 16-token block for SmolLM2-135M in fp32: 29 MiB is 41 blocks (656 tokens). Each request needs
# ~3 blocks (a ~12-token prompt and 32 output tokens), so 64 of them want ~190.
STORM_CONFIG = EngineConfig(kv_cache_memory=29 * 2**20, max_model_len=256, max_num_seqs=64, dtype="float32",
                            quantization="dequantize")


@pytest.fixture(scope="module")
def storm_server() -> Iterator[AppServer]:
    """In-process (no process behaviour is under test); the ample cache is the shared `server` process."""
    srv = AppServer(STORM_CONFIG)
    yield srv
    srv.stop()


def _bodies() -> list[dict[str, object]]:
    return [{"prompt": f"Request {i}: here is a short story about the number {i}.", "max_tokens": MAX_TOKENS,
             "temperature": 0, "ignore_eos": True} for i in range(NUM_REQUESTS)]


async def _all_at_once(url: str, headers: dict[str, str]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=NUM_REQUESTS + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in _bodies()))


def test_preemption_storm(storm_server: AppServer, server: ServerProcess) -> None:
    assert "-> 41 blocks" in storm_server.output()
    t0 = time.perf_counter()
    stormy = asyncio.run(_all_at_once(storm_server.url, {}))
    t1 = time.perf_counter()
    ample = asyncio.run(_all_at_once(server.url, {"Authorization": f"Bearer {API_KEY}"}))
    print(f"storm {t1 - t0:.1f}s, ample cache {time.perf_counter() - t1:.1f}s")
    for i, (a, b) in enumerate(zip(stormy, ample)):
        assert a.status_code == 200 and b.status_code == 200, (i, a.text, b.text)
        assert a.json()["usage"]["completion_tokens"] == MAX_TOKENS
        assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"], i
    gauges = server_gauges(httpx.get(f"{storm_server.url}/metrics").text)
    print(gauges)
    assert gauges["num_preemptions_total"] > 0, gauges
    assert gauges["kv_cache_usage_perc"] == 0 and gauges["num_requests_running"] == 0 \
        and gauges["num_requests_waiting"] == 0, gauges
