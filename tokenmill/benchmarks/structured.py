"""The cost of structured output: throughput with every request under a JSON schema against the same
requests unconstrained, in one run.

    tokenmill bench structured --concurrency 16 --rounds 3 --max-num-seqs 16

Each round sends C chat requests at once ("Reply in JSON with <what>", the 50 schemas of
benchmarks/json_schemas.py in turn), first constrained, then unconstrained with `max_tokens` set to each
request's constrained length and ignore_eos, so both produce exactly the same number of tokens from the
same prompts (every prompt is run once before timing, so both find it in the prefix cache). Reported:
output tok/s of each, their ratio (constrained / unconstrained; 1.0 = free), and the engine's own mask
cost (filling bitmasks and advancing matchers) per constrained token.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from tokenmill.benchmarks.json_schemas import SCHEMAS
from tokenmill.entrypoints.llm import LLM
from tokenmill.sampling_params import SamplingParams, StructuredOutputsParams


def _timed(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]
    return time.perf_counter() - t0, [len(o.outputs[0].token_ids) for o in outs]


def run_structured(llm: LLM, concurrency: int, rounds: int, temperature: float, max_tokens: int,
                   seed: int, save_workload: str | None = None) -> dict[str, Any]:
    """save_workload: write the rounds' prompts (token ids) and schemas there (JSON), for a peer's run
    of the same workload (benchmarks/peers/vllm_structured.py)."""
    proc = llm.engine.input_processor
    cases = [SCHEMAS[i % len(SCHEMAS)] for i in range(concurrency * rounds)]
    prompts = [proc.render_chat_ids([{"role": "user", "content": f"Reply in JSON with {what}."}], True)
               for what, _ in cases]
    if save_workload:
        with open(save_workload, "w") as f:
            json.dump({"concurrency": concurrency, "rounds": rounds, "temperature": temperature,
                       "max_tokens": max_tokens, "seed": seed,
                       "requests": [{"prompt_token_ids": p, "schema": sc} for p, (_, sc) in zip(prompts, cases)]}, f)
    specs = [StructuredOutputsParams(json=schema) for _, schema in cases]
    for s in specs:
        llm.engine.structured.compile(s)  # compiled before timing: the cost per token is the mask, not compiling
    # every prompt once first, so both sides find it in the prefix cache: the comparison is of decoding
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    mgr = llm.engine.structured
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        sl = slice(r * concurrency, (r + 1) * concurrency)
        cparams = [SamplingParams(temperature=temperature, seed=seed + i, max_tokens=max_tokens, structured_outputs=s)
                   for i, s in enumerate(specs[sl])]
        mask_s0, masks0 = mgr.mask_seconds, mgr.num_masks
        constrained_s, lens = _timed(llm, prompts[sl], cparams)
        mask_s, masks = mgr.mask_seconds - mask_s0, mgr.num_masks - masks0
        fparams = [SamplingParams(temperature=temperature, seed=seed + i, max_tokens=n, ignore_eos=True)
                   for i, n in enumerate(lens)]
        free_s, free_lens = _timed(llm, prompts[sl], fparams)
        assert free_lens == lens
        n_tok = sum(lens)
        per_round.append({"tokens": n_tok, "constrained_s": constrained_s, "free_s": free_s,
                          "ratio": free_s / constrained_s, "mask_ms_per_token": 1e3 * mask_s / max(masks, 1)})
    ratios = [x["ratio"] for x in per_round]
    tok = sum(x["tokens"] for x in per_round)
    return {"concurrency": concurrency, "rounds": rounds, "temperature": temperature,
            "output_tokens": tok,
            "constrained_tok_per_s": tok / sum(x["constrained_s"] for x in per_round),
            "free_tok_per_s": tok / sum(x["free_s"] for x in per_round),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "mask_ms_per_token": statistics.median(x["mask_ms_per_token"] for x in per_round),
            "per_round": per_round}
