"""What speculative decoding buys, in one process: the same prompts through an engine without it and one
with it, alternately, greedy, output tok/s of each and the speed-up, with the acceptance rate.

    tokenmill bench spec --workload grounded --concurrency 1      (tokenmill/benchmarks/prompts/spec_grounded.json)
    tokenmill bench spec --workload random --concurrency 16       (random token prompts: the rule's side)

grounded: chat prompts whose answers mostly repeat the prompt (a file to edit, a text to summarise with
quotes), each run alone (C=1) or C copies at once; random: `bench throughput`'s random token prompts,
C at a time, `--output-len` tokens each. Both engines are built from the same settings; the speculating
one adds --speculative-config.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tokenmill.benchmarks.throughput import random_prompts
from tokenmill.entrypoints.llm import LLM
from tokenmill.sampling_params import SamplingParams

# package data, so that `tokenmill bench spec` finds it from an installed wheel too (benchmarks/prompts/ links to it)
GROUNDED = Path(__file__).resolve().parent / "prompts" / "spec_grounded.json"


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def run_spec(off: LLM, on: LLM, workload: str, concurrency: int, output_len: int, repeats: int,
             seed: int, prompts_path: str | None = None) -> dict[str, Any]:
    if workload == "grounded":
        convs = json.loads(Path(prompts_path or GROUNDED).read_text())
        proc = off.engine.input_processor
        cases = {name: [proc.render_chat_ids(msgs, True)] * concurrency for name, msgs in convs.items()}
        params = SamplingParams(temperature=0, max_tokens=output_len)
    else:
        cases = {"random": random_prompts(off, concurrency, 200, seed)}
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    for llm in (off, on):  # warm, and every prompt in both prefix caches
        for prompts in cases.values():
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    spec = on.engine.spec
    assert spec is not None
    result: dict[str, Any] = {"workload": workload, "concurrency": concurrency, "output_len": output_len,
                              "speculative_config": vars(spec.config), "cases": {}}
    for name, prompts in cases.items():
        t_off = t_on = 0.0
        n_off = n_on = 0
        d0, a0, v0 = spec.num_draft_tokens, spec.num_accepted_tokens, spec.num_drafts
        for r in range(repeats):  # alternate, so drift on a busy machine hits both
            for llm in ((off, on) if r % 2 == 0 else (on, off)):
                dt, n = _run(llm, prompts, params)
                if llm is off:
                    t_off, n_off = t_off + dt, n_off + n
                else:
                    t_on, n_on = t_on + dt, n_on + n
        drafts, accepted, runs = spec.num_draft_tokens - d0, spec.num_accepted_tokens - a0, spec.num_drafts - v0
        result["cases"][name] = {
            "off_tok_per_s": n_off / t_off, "on_tok_per_s": n_on / t_on, "speedup": (n_on / t_on) / (n_off / t_off),
            "output_tokens": n_on // repeats, "draft_tokens": drafts, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else None,
            "mean_draft_length": drafts / runs if runs else None,
            # the rule's measured cost of one more row, as a fraction of a one-request decode step (the line)
            "row_cost": spec.cost.row_cost(concurrency),
            # the mean time of the recent decode steps of each size seen, ms
            "step_ms": {r: round(1e3 * t, 2)
                        for r in range(1, concurrency * (spec.config.max_drafts + 1) + 1)
                        if spec.cost.knows(r) and (t := spec.cost.time(r)) is not None},
            # the last window's measured gain from drafting, and the windows that lost time (everyone paused)
            "gain": spec.gain, "losing_windows": spec.num_pauses}
    return result
