"""Many concurrent streams with a responsive /health, and client disconnects that abort their requests."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx
from conftest import API_KEY
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess, wait_for

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def metrics(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", headers=HEADERS).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + s.labels["finished_reason"] + "}" if "finished_reason" in s.labels else "")
            out[key] = s.value
    return out


def test_metric_names(server: ServerProcess) -> None:
    text = httpx.get(f"{server.url}/metrics", headers=HEADERS).text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "request_time_per_output_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds",
                 "request_prompt_tokens", "request_generation_tokens", "request_max_num_generation_tokens",
                 "request_params_max_tokens", "request_params_n"):
        assert f"# TYPE tokenmill:{name} histogram" in text
    info = [s for fam in text_string_to_metric_families(text) if fam.name == "tokenmill:cache_config_info"
            for s in fam.samples]
    assert len(info) == 1 and info[0].value == 1.0 and int(info[0].labels["block_size"]) > 0
    assert int(info[0].labels["num_gpu_blocks"]) > 0 and info[0].labels["enable_prefix_caching"] in ("True", "False")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"# TYPE tokenmill:{name} gauge" in text
    for name in ("prompt_tokens", "generation_tokens", "request_success", "num_preemptions",
                 "prefix_cache_queries", "prefix_cache_hits"):
        assert f"tokenmill:{name}_total{{" in text
    for reason in ("stop", "length", "abort", "error"):
        assert f'tokenmill:request_success_total{{finished_reason="{reason}",model_name="SmolLM2-135M-Instruct"}}' \
            in text


def test_32_concurrent_streams_and_health(server: ServerProcess) -> None:
    num_clients, max_tokens = 32, 16
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client() as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                assert c.get(f"{server.url}/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)

    gaps: list[float] = []  # between a stream's token chunks: one engine step at about this batch

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str | None, int]:
        body = {"prompt": f"Story number {i}:", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8,
                "stream": True, "stream_options": {"include_usage": True}}
        num_text_chunks, finish, usage = 0, None, -1
        last = None
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    num_text_chunks += 1
                    finish = chunk["choices"][0]["finish_reason"] or finish
                else:
                    usage = chunk["usage"]["completion_tokens"]
        return usage, finish, num_text_chunks

    async def main() -> list[tuple[int, str | None, int]]:
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(num_clients)))

    before = metrics(server)
    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        results = asyncio.run(main())
    finally:
        stop.set()
        poller.join()
    assert all(usage == max_tokens and finish == "length" and chunks >= 1 for usage, finish, chunks in results), results
    after = metrics(server)

    def grew(name: str) -> float:
        return after[f"tokenmill:{name}"] - before.get(f"tokenmill:{name}", 0.0)

    assert grew("request_params_max_tokens_count") == grew("request_params_n_count") == num_clients
    assert grew("request_params_max_tokens_sum") == grew("request_max_num_generation_tokens_sum") == \
        num_clients * max_tokens
    assert grew("request_params_n_sum") == num_clients and grew("request_inference_time_seconds_count") == num_clients
    assert len(latencies) >= 5
    # /health must not wait for engine steps: under 100 ms, or under half a measured step where a busy or slow
    # machine makes steps long. A loop blocked by the engine would make most polls wait about half a step
    # or more, so the 90th percentile is held to the bound: one poll descheduled on a shared machine (seen
    # once: 351 ms against a 124 ms bound) is not the loop being blocked
    bound = max(0.1, 0.5 * statistics.median(gaps))
    p90 = statistics.quantiles(latencies, n=10)[-1]
    assert p90 < bound, f"/health p90 took {p90 * 1000:.0f} ms (bound {bound * 1000:.0f} ms; max {max(latencies) * 1000:.0f})"


def test_disconnect_aborts(server: ServerProcess) -> None:
    before = metrics(server)["tokenmill:request_success_total{abort}"]
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    # another request keeps running meanwhile and must finish normally
    other = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/completions", headers=HEADERS, timeout=60,
                                                       json={"prompt": "Hi", "max_tokens": 30, "ignore_eos": True}))
    other.start()
    t0 = time.monotonic()
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: {"):
                got += 1
            if got == 3:
                break  # leaving the block closes the connection mid-stream
    # time enough for a request to be admitted and start (10x what 3 tokens took), far from 1000 tokens
    give_up_s = max(1.0, 10 * (time.monotonic() - t0))
    assert wait_for(lambda: metrics(server)["tokenmill:request_success_total{abort}"] == before + 1)
    # non-streaming: the client gives up (timeout) and its request is aborted as well
    try:
        httpx.post(f"{server.url}/v1/completions", headers=HEADERS, timeout=give_up_s,
                   json={"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True})
    except httpx.TimeoutException:
        pass
    assert wait_for(lambda: metrics(server)["tokenmill:request_success_total{abort}"] == before + 2)
    other.join()
    assert wait_for(lambda: metrics(server)["tokenmill:kv_cache_usage_perc"] == 0.0
                     and metrics(server)["tokenmill:num_requests_running"] == 0)
