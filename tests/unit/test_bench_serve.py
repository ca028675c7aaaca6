"""The serving benchmark's pieces without a server: prompt lengths, SSE parsing, metric definitions."""

from __future__ import annotations

import asyncio
import json

import pytest

from tokenmill.benchmarks.client import RequestResult, build_payload, send_request
from tokenmill.benchmarks.datasets import SampleRequest, random_dataset, shared_prefix_dataset
from tokenmill.benchmarks.serve_metrics import parse_goodput, summarize


@pytest.fixture(scope="module")
def tok():
    from tokenmill.benchmarks.serve import load_tokenizer

    return load_tokenizer("default")


def test_random_prompts_have_exact_lengths_and_unique_first_tokens(tok) -> None:
    samples = random_dataset(tok, 50, 200, 64, seed=3)
    ids = [tok.encode(s.prompt, add_special_tokens=False) for s in samples]
    assert all(len(i) == 200 == s.prompt_len for i, s in zip(ids, samples))
    assert len({i[0] for i in ids}) == 50
    assert all(s.output_len == 64 for s in samples)
    assert random_dataset(tok, 5, 20, 4, seed=3) == random_dataset(tok, 5, 20, 4, seed=3)


def test_range_ratio_bounds(tok) -> None:
    samples = random_dataset(tok, 40, 100, 50, range_ratio=0.5, seed=1)
    assert all(50 <= s.prompt_len <= 150 and 25 <= s.output_len <= 75 for s in samples)
    assert len({s.prompt_len for s in samples}) > 1


def test_shared_prefix_groups(tok) -> None:
    samples = shared_prefix_dataset(tok, 6, 2, prefix_len=64, suffix_len=16, output_len=8)
    head = [tok.encode(s.prompt, add_special_tokens=False)[:64] for s in samples]
    assert head[0] == head[2] == head[4] and head[1] == head[3] and head[0] != head[1]


def _sse(frames: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames) + b"data: [DONE]\n\n"


def _run(frames: list[dict], endpoint: str = "chat", status: int = 200) -> tuple[RequestResult, dict]:
    import httpx

    seen: dict = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "nope"}})
        return httpx.Response(200, content=_sse(frames), headers={"content-type": "text/event-stream"})

    async def go() -> RequestResult:
        sample = SampleRequest("hello there", 2, 3)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_request(client, "http://x/v1/chat/completions",
                                      build_payload(sample, endpoint, "m"), sample)

    return asyncio.run(go()), seen


def test_chat_stream_role_chunk_is_not_the_first_token() -> None:
    frames = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": "a"}}]},
              {"choices": [{"index": 0, "delta": {"content": "b"}}]},
              {"choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}]
    res, body = _run(frames)
    assert res.success and res.generated_text == "abc"
    assert (res.prompt_len, res.output_len, len(res.itl)) == (11, 3, 2)
    assert body["ignore_eos"] is True and body["max_tokens"] == 3 and body["stream_options"]["include_usage"]
    assert body["messages"] == [{"role": "user", "content": "hello there"}]


def test_completions_stream_without_usage_counts_chunks() -> None:
    frames = [{"choices": [{"index": 0, "text": t}]} for t in ("x", "y")]
    res, body = _run(frames, endpoint="completions")
    assert res.success and res.output_len == 2 and body["prompt"] == "hello there"


def test_ollama_chat_ndjson_stream() -> None:
    import httpx

    lines = [{"model": "m", "message": {"role": "assistant", "content": t}, "done": False} for t in ("a", "b")]
    lines.append({"model": "m", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop",
                  "prompt_eval_count": 9, "eval_count": 2})
    seen: dict = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content), path=request.url.path)
        body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        return httpx.Response(200, content=body, headers={"content-type": "application/x-ndjson"})

    async def go() -> RequestResult:
        sample = SampleRequest("hello there", 2, 3)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_request(client, "http://x/api/chat", build_payload(sample, "ollama-chat", "m"), sample)

    res = asyncio.run(go())
    assert res.success and res.generated_text == "ab" and (res.prompt_len, res.output_len, len(res.itl)) == (9, 2, 1)
    assert seen["options"] == {"temperature": 0.0, "num_predict": 3} and seen["stream"] is True
    assert seen["messages"] == [{"role": "user", "content": "hello there"}] and "ignore_eos" not in seen


def test_http_error_is_a_failed_request() -> None:
    res, _ = _run([], status=400)
    assert not res.success and res.error.startswith("HTTP 400")


def test_metric_definitions() -> None:
    # two requests: TTFT 1 s and 2 s; 5 output tokens each; E2EL 3 s and 4 s -> TPOT 0.5 s both
    rs = [RequestResult(success=True, prompt_len=10, output_len=5, ttft=1.0, e2el=3.0, itl=[0.5] * 4),
          RequestResult(success=True, prompt_len=10, output_len=5, ttft=2.0, e2el=4.0, itl=[0.5] * 4),
          RequestResult(success=False, error="boom")]
    m = summarize(rs, duration_s=5.0, slos=parse_goodput(["ttft:1500", "tpot:600"]))
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["output_throughput"] == pytest.approx(2.0) and m["total_token_throughput"] == pytest.approx(6.0)
    assert m["request_throughput"] == pytest.approx(0.4)
    assert m["mean_ttft_ms"] == pytest.approx(1500) and m["median_tpot_ms"] == pytest.approx(500)
    assert m["mean_itl_ms"] == pytest.approx(500) and m["p99_e2el_ms"] == pytest.approx(3990)
    assert m["goodput_requests"] == 1 and m["request_goodput"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        parse_goodput(["latency:5"])


def test_offline_serve_prompts_are_what_bench_serve_sends(tok) -> None:
    """`bench throughput --prompts serve` must run the very prompts a `bench serve` level sends, or the
    server-vs-engine ratio compares different work."""
    import argparse

    from tokenmill.benchmarks.serve import make_samples
    from tokenmill.benchmarks.throughput import serve_prompts

    args = argparse.Namespace(dataset="random", random_input_len=50, random_output_len=8, random_range_ratio=0.0)
    sent = [s.prompt for s in make_samples(args, tok, 12, seed=3)]
    assert serve_prompts(tok, 12, 50, 8, seed=3) == sent
    assert serve_prompts(tok, 12, 50, 8, seed=4) != sent
