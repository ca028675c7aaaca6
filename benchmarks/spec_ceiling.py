"""What n-gram speculation could reach on a workload at a given row cost: a replay, no timing.

    .venv/bin/python benchmarks/spec_ceiling.py [--dtype auto] [--output-len 128] [--row-costs 0.05,0.1,0.25]

Generates each grounded prompt's greedy answer once (benchmarks/prompts/spec_grounded.json, the engine's
defaults), then replays it: at every position the n-gram proposer (engine/ngram_proposer.py, the same
prompt_lookup_min/max as the default SpeculativeConfig) offers its drafts, and we know how many of them the
greedy answer would have kept. A step that verifies k drafts is costed 1 + row_cost * k one-row steps (the
line StepCost fits; row_cost is what `tokenmill bench spec` reports as `row_cost`). Printed per prompt and
row cost, as speed-ups over plain decoding (tokens / step cost):
  oracle    each step drafts exactly the drafts that will be accepted (no policy can do better with these
            drafts; the ceiling);
  fixed k   always k drafts (vLLM's rule);
  adaptive  the engine's default rule (best_draft_length over a decayed per-request acceptance, the same
            prior and decay as engine/spec_decode.py; pauses left out, so slightly optimistic).
The replay leaves out what a step costs besides its rows (drafting, bookkeeping), so measured speed-ups
sit a little below it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenmill.config import SpeculativeConfig  # noqa: E402
from tokenmill.engine.ngram_proposer import propose  # noqa: E402
from tokenmill.engine.spec_decode import _DECAY, _PRIOR_ACCEPTED, _PRIOR_REJECTED  # noqa: E402
from tokenmill.engine.step_cost import best_draft_length  # noqa: E402


def accepted_runs(prompt: list[int], output: list[int], k: int, min_n: int, max_n: int) -> list[tuple[int, int]]:
    """For each output position t: (drafts offered, of them accepted) with the sequence prompt + output[:t]."""
    runs = []
    for t in range(len(output)):
        text = "".join(map(chr, prompt + output[:t]))
        drafts = propose(text, k, min_n, max_n)
        a = 0
        while a < len(drafts) and t + a < len(output) and drafts[a] == output[t + a]:
            a += 1
        runs.append((len(drafts), a))
    return runs


def replay(runs: list[tuple[int, int]], row_cost: float, policy: str, k_max: int) -> float:
    """Speed-up over plain decoding of the answer whose per-position drafts are `runs`."""
    T, t, cost = len(runs), 0, 0.0
    acc_w, rej_w = _PRIOR_ACCEPTED, _PRIOR_REJECTED
    while t < T:
        offered, good = runs[t]
        if policy == "oracle":
            k = good
        elif policy == "adaptive":
            k = best_draft_length(acc_w / (acc_w + rej_w), row_cost, k_max)
        else:
            k = int(policy)
        k = min(k, offered, T - t - 1)
        kept = min(good, k)
        cost += 1.0 + row_cost * k
        if k and policy == "adaptive":
            acc_w, rej_w = _DECAY * acc_w + kept, _DECAY * rej_w + (kept < k)
        t += kept + 1
    return T / cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--row-costs", default="0.05,0.1,0.15,0.2,0.25,0.3")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    from tokenmill.benchmarks.spec import GROUNDED
    from tokenmill.entrypoints.llm import LLM
    from tokenmill.sampling_params import SamplingParams

    kw = {"dtype": args.dtype} | ({"quantization": args.quantization} if args.quantization else {})
    llm = LLM(**kw)
    cfg = SpeculativeConfig(method="ngram")
    proc = llm.engine.input_processor
    result: dict[str, dict[str, object]] = {}
    for name, msgs in json.loads(GROUNDED.read_text()).items():
        prompt = proc.render_chat_ids(msgs, True)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=args.output_len), use_tqdm=False)[0]
        output = list(out.outputs[0].token_ids)
        deep = accepted_runs(prompt, output, 8, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
        k4 = [(min(o, cfg.num_speculative_tokens), min(a, cfg.num_speculative_tokens)) for o, a in deep]
        rows: dict[str, dict[str, float]] = {}
        for rc in (float(x) for x in args.row_costs.split(",")):
            rows[str(rc)] = {"oracle": replay(deep, rc, "oracle", 8), "oracle_k4": replay(k4, rc, "oracle", 4),
                             "fixed_2": replay(k4, rc, "2", 4), "fixed_4": replay(k4, rc, "4", 4),
                             "adaptive_k4": replay(k4, rc, "adaptive", 4), "adaptive_k8": replay(deep, rc, "adaptive", 8)}
        drafted = sum(1 for o, _ in deep if o)
        result[name] = {"output_tokens": len(output), "positions_with_a_match": drafted,
                        "positions_whose_first_draft_is_right": sum(1 for _, a in deep if a), "speedup": rows}
        print(f"{name}: {len(output)} tokens; a match at {drafted}, first draft right at "
              f"{result[name]['positions_whose_first_draft_is_right']}")
        print("  row_cost " + " ".join(f"{k:>12}" for k in next(iter(rows.values()))))
        for rc_name, r in rows.items():
            print(f"  {rc_name:>8} " + " ".join(f"{v:12.2f}" for v in r.values()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
