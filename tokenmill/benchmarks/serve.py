"""`tokenmill bench serve`: load-test any OpenAI-compatible server, vLLM-style.

    tokenmill bench serve --base-url http://127.0.0.1:8000 --sweep 1,4,16,64 \\
        --random-input-len 200 --random-output-len 64 --prompts-per-concurrency 2 --result-dir results/

Load: `--max-concurrency C` caps requests in flight (a semaphore); `--request-rate R` issues requests as
a Poisson process of R per second (`inf`: all at once); both may be combined. `--sweep 1,4,16` runs one
level per concurrency, with fresh prompts each time (no prefix from an earlier level is reused).
Every request streams with usage and `ignore_eos`, so each generates exactly its output length.
`--endpoint ollama-chat` posts to Ollama's /api/chat (NDJSON) instead; Ollama's API has no ignore_eos, so
its requests stop at EOS: compare it with `--endpoint chat --extra-body '{"ignore_eos": false}'`, which then
generates the same greedy tokens.
Metrics and their definitions: `client.py` (per request) and `serve_metrics.py` (aggregate).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import math
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.benchmarks.datasets import (SampleRequest, TextTokenizer, jsonl_dataset, random_dataset,
                                           shared_prefix_dataset)
from tokenmill.benchmarks.serve_metrics import format_summary, parse_goodput, summarize

if TYPE_CHECKING:  # httpx is imported when a benchmark runs, so the CLI parser does not need it
    import httpx

    from tokenmill.benchmarks.client import RequestResult


@dataclass(frozen=True)
class LoadSpec:
    """How one level issues its requests."""

    max_concurrency: int | None  # None: unlimited
    request_rate: float  # requests/s; inf = all at once
    burstiness: float = 1.0  # gamma shape of the gaps; 1.0 = Poisson


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (CPU model, cores, memory, load when the run started)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info: dict[str, Any] = {"cpu": cpu, "num_cpus": os.cpu_count(), "memory_gib": mem_gib,
                            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version()}
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def load_tokenizer(spec: str) -> TextTokenizer:
    """tokenmill's tokenizer for 'default', a .gguf file or an HF directory (no weights are loaded)."""
    from tokenmill.loader.model_source import resolve_model
    from tokenmill.tokenizer.tokenizer import Tokenizer

    src = resolve_model(spec)
    return Tokenizer.from_gguf_file(src.path) if src.kind == "gguf" else Tokenizer.from_hf_dir(src.path)


async def server_model(client: httpx.AsyncClient, base_url: str, headers: dict[str, str],
                       wait_s: float = 0.0) -> dict[str, Any]:
    """The first entry of GET /v1/models, polling up to `wait_s` seconds while the server starts."""
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            r = await client.get(f"{base_url}/v1/models", headers=headers)
            if r.status_code == 200 and r.json().get("data"):
                return dict(r.json()["data"][0])
            reason = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            reason = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise ConnectionError(f"{base_url}/v1/models is not answering ({reason}); is the server up?")
        await asyncio.sleep(1.0)


def _gaps(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds to wait before each request: 0 for rate inf, else gamma gaps of mean 1/rate."""
    if math.isinf(rate):
        return [0.0] * n
    return [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]


async def run_level(client: httpx.AsyncClient, url: str, bodies: list[dict[str, Any]], samples: list[SampleRequest],
                    load: LoadSpec, headers: dict[str, str], seed: int) -> tuple[list[RequestResult], float]:
    """Issue every request under `load`; returns the results (in input order) and the wall time from the
    first send to the last completion."""
    from tokenmill.benchmarks.client import send_request

    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None

    async def one(body: dict[str, Any], sample: SampleRequest) -> RequestResult:
        if sem is None:
            return await send_request(client, url, body, sample, headers)
        async with sem:
            return await send_request(client, url, body, sample, headers)

    tasks = []
    t0 = time.perf_counter()
    for gap, body, sample in zip(_gaps(len(bodies), load.request_rate, load.burstiness, random.Random(seed)),
                                 bodies, samples):
        if gap > 0:
            await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(body, sample)))
    results = list(await asyncio.gather(*tasks))
    return results, time.perf_counter() - t0


def make_samples(args: argparse.Namespace, tok: TextTokenizer | None, num_prompts: int,
                 seed: int) -> list[SampleRequest]:
    """The dataset chosen by --dataset, `num_prompts` long, drawn with `seed`."""
    if args.dataset == "random":
        assert tok is not None
        return random_dataset(tok, num_prompts, args.random_input_len, args.random_output_len,
                              args.random_range_ratio, seed)
    if args.dataset == "shared-prefix":
        assert tok is not None
        return shared_prefix_dataset(tok, num_prompts, args.prefix_num_groups, args.prefix_len,
                                     args.random_input_len, args.random_output_len, seed)
    if not args.dataset_path:
        raise ValueError("--dataset jsonl needs --dataset-path FILE")
    return jsonl_dataset(args.dataset_path, tok, num_prompts, args.random_output_len, seed, shuffle=True)


def dataset_info(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {"name": args.dataset, "output_len": args.random_output_len}
    if args.dataset in ("random", "shared-prefix"):
        info.update(input_len=args.random_input_len, range_ratio=args.random_range_ratio)
    if args.dataset == "shared-prefix":
        info.update(prefix_len=args.prefix_len, num_groups=args.prefix_num_groups)
    if args.dataset == "jsonl":
        info["path"] = args.dataset_path
    return info


def result_path(args: argparse.Namespace, label: str, concurrency: int | None, num_levels: int) -> Path | None:
    """Where one level's JSON goes: --result-json (suffixed -cN in a sweep) or --result-dir/LABEL-...-cN.json."""
    tag = f"c{concurrency}" if concurrency else f"r{args.request_rate}"
    if args.result_json:
        p = Path(args.result_json)
        return p if num_levels == 1 else p.with_name(f"{p.stem}-{tag}{p.suffix or '.json'}")
    if args.result_dir:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        return Path(args.result_dir) / f"{safe}-{args.dataset}-{args.endpoint}-{tag}.json"
    return None


def _levels(args: argparse.Namespace) -> list[int | None]:
    if args.sweep:
        try:
            levels = [int(x) for x in args.sweep.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--sweep takes comma-separated concurrency levels, e.g. 1,4,16; got {args.sweep!r}")
        if not levels or min(levels) < 1:
            raise ValueError("--sweep levels must be positive integers")
        return list(levels)
    return [args.max_concurrency]


def _num_prompts(args: argparse.Namespace, concurrency: int | None) -> int:
    if args.prompts_per_concurrency and concurrency:
        return max(args.min_prompts, args.prompts_per_concurrency * concurrency)
    return args.num_prompts


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every level; returns one record per level (also written as JSON when asked)."""
    import httpx

    from tokenmill.benchmarks.client import ENDPOINT_PATHS, build_payload

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    slos = parse_goodput(args.goodput)
    levels = _levels(args)
    extra = json.loads(args.extra_body) if args.extra_body else {}
    if not isinstance(extra, dict):
        raise ValueError("--extra-body must be a JSON object")
    base_url = args.base_url.rstrip("/")
    url = f"{base_url}{ENDPOINT_PATHS[args.endpoint]}"
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    tok = load_tokenizer(args.tokenizer) if args.dataset != "jsonl" or args.tokenizer != "none" else None

    # One draw for the whole run: warm-ups and every level get distinct prompts (distinct first tokens).
    counts = [_num_prompts(args, c) for c in levels]
    all_samples = make_samples(args, tok, args.num_warmups + sum(counts), args.seed)
    warm, rest = all_samples[:args.num_warmups], all_samples[args.num_warmups:]

    max_conc = max((c for c in levels if c), default=None)
    conns = max(max_conc or 0, max(counts)) + 4
    timeout = httpx.Timeout(args.timeout, connect=30.0)
    records = []
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=conns,
                                                                      max_keepalive_connections=conns)) as client:
        info = await server_model(client, base_url, headers, args.wait_for_server)
        model = args.model or str(info["id"])
        label = args.label or str(info.get("owned_by") or model)
        print(f"bench serve: {label} at {base_url}, model {model!r}, {args.endpoint}, levels {levels}", flush=True)

        def bodies(samples: list[SampleRequest]) -> list[dict[str, Any]]:
            return [build_payload(s, args.endpoint, model, extra, args.temperature) for s in samples]

        if warm:
            wres, _ = await run_level(client, url, bodies(warm), warm,
                                      LoadSpec(min(len(warm), max_conc or len(warm)), math.inf), headers, args.seed)
            bad = [r.error for r in wres if not r.success]
            if bad:
                raise RuntimeError(f"warm-up request failed: {bad[0]}")
            print(f"bench serve: {len(warm)} warm-up requests done", flush=True)

        start = 0
        for concurrency, n in zip(levels, counts):
            samples = rest[start:start + n]
            start += n
            load = LoadSpec(concurrency, args.request_rate, args.burstiness)
            date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            load_at_start = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
            results, duration = await run_level(client, url, bodies(samples), samples, load, headers,
                                                args.seed + start)
            metrics = summarize(results, duration, slos)
            machine = machine_info()
            if hasattr(os, "getloadavg"):  # on a shared machine, the load during the level says how clean it was
                machine["loadavg_at_start"] = load_at_start
                machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
            record: dict[str, Any] = {
                "label": label, "base_url": base_url, "endpoint": args.endpoint, "model": model,
                "server_owned_by": info.get("owned_by"), "date": date,
                "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "machine": machine, "dataset": dataset_info(args),
                "max_concurrency": concurrency,
                "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",  # strict JSON
                "burstiness": args.burstiness,
                "num_prompts": n, "num_warmups": args.num_warmups, "seed": args.seed, "temperature": args.temperature,
                **metrics,
            }
            if args.save_detailed:
                record["requests"] = [{k: v for k, v in asdict(r).items() if k != "generated_text"} for r in results]
            title = f"{label} c={concurrency if concurrency else 'inf'} rate={args.request_rate}"
            print(format_summary(title, metrics), flush=True)
            if (path := result_path(args, label, concurrency, len(levels))) is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=2) + "\n")
                print(f"bench serve: wrote {path}", flush=True)
            records.append(record)
    return records


def add_serve_bench_args(p: argparse.ArgumentParser) -> None:
    """The flags of `tokenmill bench serve`."""
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server's root URL (without /v1)")
    s.add_argument("--endpoint", choices=["completions", "chat", "ollama-chat"], default="completions",
                   help="/v1/completions, /v1/chat/completions, or Ollama's /api/chat")
    s.add_argument("--model", default=None, help="model name to send (default: the first of GET /v1/models)")
    s.add_argument("--label", default=None, help="server label in the results (default: owned_by of /v1/models)")
    s.add_argument("--api-key", default=None, help="Bearer token (default: $OPENAI_API_KEY)")
    s.add_argument("--wait-for-server", type=float, default=0.0, metavar="S",
                   help="poll /v1/models up to S seconds before starting")
    s.add_argument("--timeout", type=float, default=3600.0, help="per-request read timeout in seconds")
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset", choices=["random", "shared-prefix", "jsonl"], default="random")
    d.add_argument("--dataset-path", default=None, help="JSONL file for --dataset jsonl")
    d.add_argument("--tokenizer", default="default",
                   help="tokenizer used to size prompts: 'default', a .gguf or an HF dir (the served model's)")
    d.add_argument("--random-input-len", type=int, default=200,
                   help="prompt tokens (random); question tokens after the prefix (shared-prefix)")
    d.add_argument("--random-output-len", type=int, default=64, help="tokens generated per request")
    d.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths drawn uniformly within +-ratio of the means")
    d.add_argument("--prefix-len", type=int, default=512, help="shared system-prompt tokens (shared-prefix)")
    d.add_argument("--prefix-num-groups", type=int, default=4, help="distinct shared prefixes (shared-prefix)")
    ld = p.add_argument_group("load")
    ld.add_argument("--num-prompts", type=int, default=64, help="requests per level")
    ld.add_argument("--prompts-per-concurrency", type=int, default=0, metavar="K",
                    help="if set, each level sends max(--min-prompts, K*concurrency) requests")
    ld.add_argument("--min-prompts", type=int, default=8)
    ld.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    ld.add_argument("--sweep", default=None, metavar="C1,C2,...", help="run one level per max concurrency")
    ld.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson); inf = all at once")
    ld.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    ld.add_argument("--num-warmups", type=int, default=2, help="untimed requests before the first level")
    ld.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("request and results")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--extra-body", default=None, help="JSON object merged into every request body")
    r.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput, e.g. ttft:2000 tpot:200 e2el:10000")
    r.add_argument("--result-json", default=None, help="write the record here (a sweep adds -cN per level)")
    r.add_argument("--result-dir", default=None, help="write LABEL-DATASET-ENDPOINT-cN.json files here")
    r.add_argument("--save-detailed", action="store_true", help="keep per-request timings in the JSON")


def cmd_bench_serve(args: argparse.Namespace) -> int:
    records = asyncio.run(bench(args))
    return 0 if all(r["failed"] == 0 for r in records) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenmill bench serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_bench_args(p)
    return cmd_bench_serve(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
