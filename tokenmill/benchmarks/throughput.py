"""Offline throughput and single-stream latency through the Python API.

    tokenmill bench throughput --num-prompts 64 --input-len 200 --output-len 128
    tokenmill bench latency --input-len 200 --output-len 128    (the CLI side: benchmarks/commands.py)
Prompts are random token ids, unique from their first token (no prefix-cache flattery), greedy with
ignore_eos so every request produces exactly --output-len tokens.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from tokenmill.entrypoints.llm import LLM
from tokenmill.sampling_params import SamplingParams


def random_prompts(llm: LLM, n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    special = llm.tokenizer.special_token_ids if hasattr(llm.tokenizer, "special_token_ids") else frozenset()
    pool = [t for t in range(vocab) if t not in special]
    prompts: list[list[int]] = []
    firsts: set[int] = set()
    while len(prompts) < n:
        p = [rng.choice(pool) for _ in range(length)]
        if p[0] in firsts:
            continue
        firsts.add(p[0])
        prompts.append(p)
    return prompts


def serve_prompts(tok: Any, num_prompts: int, input_len: int, output_len: int, seed: int) -> list[str]:
    """The text prompts `tokenmill bench serve --dataset random --num-warmups 0 --seed SEED` sends for one
    level of `num_prompts` (same generator, same tokenizer), so server and offline runs can be compared."""
    from tokenmill.benchmarks.datasets import random_dataset

    return [s.prompt for s in random_dataset(tok, num_prompts, input_len, output_len, 0.0, seed)]


def run_throughput(llm: LLM, num_prompts: int, input_len: int, output_len: int, seed: int,
                   prompts_like: str = "ids", save_prompts: str | None = None) -> dict[str, Any]:
    """prompts_like: "ids" (random token ids) or "serve" (bench serve's random text prompts, see above).
    save_prompts: write the prompts' token ids there (JSON), for a peer's offline run on the same ones."""
    prompts: list[Any] = (serve_prompts(llm.tokenizer, num_prompts, input_len, output_len, seed) if prompts_like == "serve"
                          else random_prompts(llm, num_prompts, input_len, seed))
    if save_prompts:
        with open(save_prompts, "w") as f:
            json.dump([p if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts], f)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(random_prompts(llm, 2, 16, seed + 1), SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"num_prompts": num_prompts, "input_len": input_len, "output_len": output_len, "prompts": prompts_like,
            "seconds": dt,
            "requests_per_s": num_prompts / dt, "output_tok_per_s": n_out / dt,
            "total_tok_per_s": (n_out + sum(len(o.prompt_token_ids) for o in outs)) / dt}


def run_latency(llm: LLM, input_len: int, output_len: int, seed: int) -> dict[str, Any]:
    """One request: prefill tok/s (time to first token) and decode tok/s (the rest)."""
    eng = llm.engine
    prompt = random_prompts(llm, 1, input_len, seed + 7)[0]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    eng.add_request("latency", prompt, params, stream=True)
    t0 = time.perf_counter()
    first = None
    n = 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            n = len(out.outputs[0].token_ids)
            if first is None and n:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"input_len": input_len, "output_len": n, "ttft_s": first - t0, "prefill_tok_per_s": input_len / (first - t0),
            "decode_tok_per_s": (n - 1) / (end - first)}

