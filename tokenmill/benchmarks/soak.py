"""Soak: many requests at a fixed concurrency, clients hanging up at random moments, every answer checked.

    tokenmill bench soak --num-requests 10000 --concurrency 64 --out benchmarks/results/soak

Each request is one of a small set of *checked* variants (a prompt, completions or chat, greedy or seeded:
outputs that do not depend on what else runs, so the expected text is computed once up front) or, with
`random_fraction`, a request with random sampling parameters (checked for shape only: n choices, a valid
finish reason, usage within max_tokens). Streaming or not is chosen at random, and `disconnect_fraction`
of the clients give up after a random delay (while queued, in prefill or mid-stream). At the end the
server must be idle: no running or waiting requests and no KV blocks in use.

The command starts its own server (tokenmill.benchmarks.server_process, as the tests do) or targets --url,
records the server's RSS at start, after warm-up and at the end, and writes `<out>.json` and `<out>.md`.
Streams are read with the bench's SSE client (tokenmill.benchmarks.client). `run_soak` is also what
tests/server/test_server_soak.py runs (500 requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tokenmill.benchmarks.client import SSEStream, chunk_text
from tokenmill.benchmarks.server_process import ServerProcess

PROMPTS = ("The capital of France is", "Once upon a time,", "def fibonacci(n):", "The three primary colors are",
           "Water boils at", "My favourite book is", "In 1969, astronauts", "The quick brown fox")
FINISH_REASONS = {"stop", "length"}


@dataclass(frozen=True)
class Variant:
    """A request whose output is known in advance: greedy, or seeded sampling (which does not depend on
    its batch neighbours)."""

    endpoint: str  # "completions" | "chat"
    prompt: str
    sampling: tuple[tuple[str, Any], ...]  # extra body fields, hashable

    def body(self, max_tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": max_tokens, **dict(self.sampling)}
        if self.endpoint == "chat":
            out["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            out["prompt"] = self.prompt
        return out


@dataclass
class Answer:
    """What one request got back. `status` is None when the client hung up first."""

    status: int | None = None
    texts: dict[int, str] = field(default_factory=dict)  # choice index -> text
    finish_reasons: dict[int, str | None] = field(default_factory=dict)
    num_completion_tokens: int | None = None
    error: str = ""
    ttft: float | None = None  # streams: send -> first chunk with text


@dataclass
class SoakReport:
    num_requests: int
    concurrency: int
    num_completed: int = 0  # answered 200 with a complete body
    num_disconnected: int = 0  # the client hung up first
    num_checked: int = 0  # completed and compared with the expected text
    num_wrong: int = 0  # completed, but not the expected text (or a malformed answer)
    errors_by_status: dict[str, int] = field(default_factory=dict)  # non-200 answers, by status
    wrong_examples: list[str] = field(default_factory=list)
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    wall_s: float = 0.0
    requests_per_s: float = 0.0
    final_gauges: dict[str, float] = field(default_factory=dict)

    @property
    def num_server_errors(self) -> int:
        return sum(n for status, n in self.errors_by_status.items() if status.isdigit() and int(status) >= 500)


def checked_variants(prompts: tuple[str, ...] = PROMPTS) -> list[Variant]:
    """Every prompt x {completions, chat} x {greedy, seeded sampling}."""
    out = []
    for i, prompt in enumerate(prompts):
        for endpoint in ("completions", "chat"):
            out.append(Variant(endpoint, prompt, (("temperature", 0.0),)))
            out.append(Variant(endpoint, prompt, (("temperature", 0.8), ("top_p", 0.95), ("seed", 1000 + i))))
    return out


def random_sampling(rng: random.Random) -> dict[str, Any]:
    """Random but valid sampling parameters."""
    body: dict[str, Any] = {"temperature": rng.choice([0.0, 0.3, 0.7, 1.0, 1.5])}
    if rng.random() < 0.5:
        body["top_p"] = rng.choice([0.5, 0.9, 1.0])
    if rng.random() < 0.3:
        body["top_k"] = rng.choice([1, 5, 40])
    if rng.random() < 0.2:
        body["min_p"] = 0.05
    if rng.random() < 0.3:
        body["repetition_penalty"] = rng.choice([1.1, 1.3])
    if rng.random() < 0.2:
        body["presence_penalty"] = 0.5
        body["frequency_penalty"] = 0.5
    if rng.random() < 0.3:
        body["stop"] = rng.choice([["."], ["\n", " the"], "a"])
    if rng.random() < 0.2:
        body["n"] = rng.choice([2, 3])
    if rng.random() < 0.2:
        body["seed"] = rng.randrange(2**31)
    return body


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


# -- one request -----------------------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], stream: bool) -> Answer:
    """POST one request and read the whole answer; streams are parsed frame by frame."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    ans = Answer()
    t0 = time.perf_counter()
    if not stream:
        r = await client.post(path, json=body)
        ans.status = r.status_code
        data = r.json()
        if r.status_code != 200:
            ans.error = str(data.get("error", {}).get("message", data))
            return ans
        for c in data["choices"]:
            ans.texts[c["index"]] = c["message"]["content"] if endpoint == "chat" else c["text"]
            ans.finish_reasons[c["index"]] = c["finish_reason"]
        ans.num_completion_tokens = data["usage"]["completion_tokens"]
        return ans
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", path, json=body) as r:
        ans.status = r.status_code
        if r.status_code != 200:
            data = json.loads(await r.aread())
            ans.error = str(data.get("error", {}).get("message", data))
            return ans
        chunks = SSEStream(r)
        async for chunk in chunks:
            if "error" in chunk:  # an error after the headers went out
                ans.status = int(chunk["error"].get("code", 500))
                ans.error = chunk["error"]["message"]
                continue
            for c in chunk["choices"]:
                text = chunk_text(c)
                if text and ans.ttft is None:
                    ans.ttft = time.perf_counter() - t0
                ans.texts[c["index"]] = ans.texts.get(c["index"], "") + text
                if c.get("finish_reason") is not None:
                    ans.finish_reasons[c["index"]] = c["finish_reason"]
            if chunk.get("usage"):
                ans.num_completion_tokens = chunk["usage"]["completion_tokens"]
        if not chunks.is_done and ans.status == 200:
            ans.status, ans.error = 0, "the stream ended without [DONE]"
    return ans


async def compute_expected(client: httpx.AsyncClient, variants: list[Variant],
                           max_tokens: int) -> dict[Variant, tuple[str, str | None]]:
    """Each variant's (text, finish_reason), asked once (non-streaming, all at once)."""
    answers = await asyncio.gather(*(send(client, v.endpoint, v.body(max_tokens), False) for v in variants))
    out = {}
    for v, ans in zip(variants, answers):
        if ans.status != 200:
            raise RuntimeError(f"could not compute the expected output of {v}: {ans.status} {ans.error}")
        out[v] = (ans.texts[0], ans.finish_reasons[0])
    return out


# -- the soak --------------------------------------------------------------------------------------------
async def run_soak(client: httpx.AsyncClient, *, num_requests: int, concurrency: int, max_tokens: int = 8,
                   disconnect_fraction: float = 0.3, random_fraction: float = 0.0, seed: int = 0,
                   max_disconnect_delay_s: float = 2.0, variants: list[Variant] | None = None,
                   expected: dict[Variant, tuple[str, str | None]] | None = None,
                   on_progress: Any = None) -> SoakReport:
    """Send `num_requests` requests, `concurrency` at a time, and check every completed answer."""
    rng = random.Random(seed)
    variants = variants or checked_variants()
    if expected is None:
        expected = await compute_expected(client, variants, max_tokens)
    report = SoakReport(num_requests, concurrency)
    errors: Counter[str] = Counter()
    ttfts: list[float] = []
    plans = []
    for i in range(num_requests):  # decided up front, so a seed reproduces the whole run
        is_random = rng.random() < random_fraction
        variant = rng.choice(variants)
        if is_random:  # the variant's prompt and endpoint, other sampling parameters
            body = {**Variant(variant.endpoint, variant.prompt, ()).body(max_tokens), **random_sampling(rng)}
        else:
            body = variant.body(max_tokens)
        delay = rng.uniform(0.0, max_disconnect_delay_s) if rng.random() < disconnect_fraction else None
        plans.append((i, variant, body, is_random, rng.random() < 0.5, delay))
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for plan in plans:
        queue.put_nowait(plan)

    def wrong(why: str) -> None:
        report.num_wrong += 1
        if len(report.wrong_examples) < 10:
            report.wrong_examples.append(why)

    async def worker() -> None:
        while not queue.empty():
            i, variant, body, is_random, stream, delay = queue.get_nowait()
            task = asyncio.ensure_future(send(client, variant.endpoint, body, stream))
            try:
                ans = await asyncio.wait_for(task, delay) if delay is not None else await task
            except asyncio.TimeoutError:  # the client hung up: wait_for cancelled it, closing the connection
                report.num_disconnected += 1
                continue
            except httpx.HTTPError as e:
                errors[type(e).__name__] += 1
                continue
            if on_progress is not None:
                on_progress(i)
            if ans.status != 200:
                errors[str(ans.status)] += 1
                if len(report.wrong_examples) < 10:
                    report.wrong_examples.append(f"request {i}: {ans.status} {ans.error}")
                continue
            report.num_completed += 1
            if ans.ttft is not None:
                ttfts.append(ans.ttft)
            n = int(body.get("n", 1))
            if sorted(ans.texts) != list(range(n)) or any(ans.finish_reasons.get(k) not in FINISH_REASONS
                                                          for k in range(n)):
                wrong(f"request {i}: malformed answer {ans}")
                continue
            if ans.num_completion_tokens is None or not 0 < ans.num_completion_tokens <= n * max_tokens:
                wrong(f"request {i}: usage.completion_tokens {ans.num_completion_tokens} (n={n})")
                continue
            if not is_random:
                report.num_checked += 1
                want = expected[variant]
                if (ans.texts[0], ans.finish_reasons[0]) != want:
                    wrong(f"request {i} ({variant.endpoint}, {dict(variant.sampling)}, stream={stream}): got "
                          f"{(ans.texts[0], ans.finish_reasons[0])!r}, expected {want!r}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.wall_s = time.perf_counter() - t0
    report.requests_per_s = num_requests / report.wall_s if report.wall_s else 0.0
    report.errors_by_status = dict(sorted(errors.items()))
    report.ttft_p50_s = percentile(ttfts, 50)
    report.ttft_p99_s = percentile(ttfts, 99)
    return report


def server_gauges(text: str) -> dict[str, float]:
    """running / waiting / KV usage / preemptions from a /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name.removeprefix("tokenmill:")
            if name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                        "num_preemptions_total"):
                out[name] = s.value
    return out


async def wait_idle(client: httpx.AsyncClient, timeout: float = 15.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds KV blocks; the last gauges either way."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = server_gauges((await client.get("/metrics")).text)
        idle = (gauges.get("num_requests_running") == 0 and gauges.get("num_requests_waiting") == 0
                and gauges.get("kv_cache_usage_perc") == 0)
        if idle or time.monotonic() > deadline:
            return gauges
        await asyncio.sleep(0.1)


def make_client(url: str, concurrency: int, api_key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits)


# -- the program -----------------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    r, rss = result["report"], result["rss_mib"]
    rows = [
        ("requests sent", r["num_requests"]), ("concurrency", r["concurrency"]),
        ("completed (200, full answer)", r["num_completed"]), ("client disconnects", r["num_disconnected"]),
        ("checked against the expected text", r["num_checked"]), ("wrong answers", r["num_wrong"]),
        ("errors by status", json.dumps(r["errors_by_status"]) if r["errors_by_status"] else "none"),
        ("server RSS at start / after warm-up / at end (MiB)",
         f"{rss['start']:.0f} / {rss['after_warmup']:.0f} / {rss['end']:.0f}"),
        ("RSS change, warm-up to end", f"{result['rss_growth_after_warmup_pct']:+.1f}%"),
        ("largest RSS in the first / second half of the run (MiB)",
         f"{rss.get('max_first_half', float('nan')):.0f} / {rss.get('max_second_half', float('nan')):.0f}"),
        ("KV cache in use at the end", r["final_gauges"].get("kv_cache_usage_perc")),
        ("running / waiting at the end", f"{r['final_gauges'].get('num_requests_running')} / "
                                         f"{r['final_gauges'].get('num_requests_waiting')}"),
        ("TTFT p50 / p99 (streams, client side)", f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])}"),
        ("wall time", f"{r['wall_s']:.0f} s ({r['requests_per_s']:.1f} requests/s)"),
    ]
    lines = [f"# Soak: {r['num_requests']} requests at {r['concurrency']} concurrent", "",
             f"`{result['command']}`", "", f"server flags: `{result['server_args']}`; {result['machine']}; "
             f"{result['date']}", "",
             "Each request: one of 8 short prompts, completions or chat, streamed or not, `max_tokens` 8. Checked "
             "ones are greedy or seeded and must equal the text computed up front; the others carry random "
             "sampling parameters (temperature, top-p/k, min-p, penalties, stop strings, n, seed) and are checked "
             "for shape. Clients that hang up do so after a random delay (queue, prefill or mid-stream). RSS is "
             "the server's, sampled every few seconds; the warm-up runs first.", "",
             "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


async def _amain(args: argparse.Namespace) -> dict[str, Any]:
    srv = None
    log_path = Path(tempfile.gettempdir()) / f"tokenmill-soak-{os.getpid()}.log"
    if args.url:
        url = args.url
    else:
        srv = ServerProcess(*shlex.split(args.server_args), log_path=log_path).wait_ready(300)
        url = srv.url
        print(f"server on {url}, log {log_path}", flush=True)
    try:
        rss: dict[str, float] = {}
        if srv:
            rss["start"] = srv.rss_bytes() / 2**20
        done = [0]

        def progress(_: int) -> None:
            done[0] += 1
            if done[0] % 500 == 0:
                print(f"  {done[0]} answered", flush=True)

        async with make_client(url, args.concurrency, args.api_key) as client:
            variants = checked_variants()
            expected = await compute_expected(client, variants, args.max_tokens)
            common = {"concurrency": args.concurrency, "max_tokens": args.max_tokens, "variants": variants,
                      "expected": expected, "disconnect_fraction": args.disconnect_fraction,
                      "random_fraction": args.random_fraction}
            warm = await run_soak(client, num_requests=args.warmup_requests, seed=args.seed + 1, **common)
            if srv:
                rss["after_warmup"] = srv.rss_bytes() / 2**20
            print(f"warm-up done: {warm.num_completed} completed, RSS {rss.get('after_warmup', 0):.0f} MiB",
                  flush=True)
            samples: list[tuple[float, int, float]] = []  # (seconds, requests answered, RSS MiB)

            async def sample_rss() -> None:
                t0 = time.monotonic()
                while srv:
                    samples.append((round(time.monotonic() - t0, 1), done[0], srv.rss_bytes() / 2**20))
                    await asyncio.sleep(args.rss_interval)

            sampler = asyncio.create_task(sample_rss())
            report = await run_soak(client, num_requests=args.num_requests, seed=args.seed, on_progress=progress,
                                    **common)
            sampler.cancel()
            report.final_gauges = await wait_idle(client)
        if srv:
            rss["end"] = srv.rss_bytes() / 2**20
            # the second half of the run against the first: a leak keeps growing, a cache being paged in does not
            half = [r for _, _, r in samples[len(samples) // 2:]]
            rss["max_first_half"] = max((r for _, _, r in samples[:len(samples) // 2]), default=float("nan"))
            rss["max_second_half"] = max(half, default=float("nan"))
        growth = (rss["end"] / rss["after_warmup"] - 1) * 100 if srv else float("nan")
        return {"report": asdict(report), "rss_mib": rss, "rss_growth_after_warmup_pct": growth,
                "rss_samples": samples,
                "warmup": {"num_requests": warm.num_requests, "num_completed": warm.num_completed,
                           "errors_by_status": warm.errors_by_status},
                "server_args": args.server_args}
    finally:
        if srv:
            srv.stop(60)


def cmd_bench_soak(args: argparse.Namespace) -> int:
    """Run the soak; 0 when every answer was right, nothing failed and no KV block was left in use."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    result = asyncio.run(_amain(args))
    own_args = sys.argv[3:] if sys.argv[1:3] == ["bench", "soak"] else sys.argv[1:]
    result["command"] = "tokenmill bench soak " + " ".join(shlex.quote(a) for a in own_args)
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    md = markdown(result)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(md)
    report = result["report"]
    ok = report["num_wrong"] == 0 and not report["errors_by_status"] and report["final_gauges"].get(
        "kv_cache_usage_perc") == 0
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    from tokenmill.benchmarks.commands import add_soak_args

    p = argparse.ArgumentParser(prog="tokenmill bench soak", description=__doc__.split("\n")[0])
    add_soak_args(p)
    return cmd_bench_soak(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
