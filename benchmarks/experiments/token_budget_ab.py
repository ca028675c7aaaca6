"""Offline cohorts at one concurrency under different step token budgets (--max-num-batched-tokens): C
requests of 200 random prompt tokens -> 64 greedy tokens (ignore_eos) added at once, the default model at
--dtype auto; per budget the cohort's wall time (best of 3 after a warm-up cohort) and its output tok/s, each
budget in its own process, twice, alternating.

    .venv/bin/python benchmarks/experiments/token_budget_ab.py C budget [budget ...]
    e.g. .venv/bin/python benchmarks/experiments/token_budget_ab.py 64 512 2048
"""
import json
import subprocess
import sys

CHILD = r'''
import json, random, sys, time
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
C, budget = int(sys.argv[1]), int(sys.argv[2])
eng = LLMEngine(EngineConfig(model="default", max_num_batched_tokens=budget), progress=False)
rng = random.Random(0)
def cohort(tag):
    for i in range(C):
        eng.add_request(f"{tag}{i}", [rng.randrange(100, 40000) for _ in range(200)],
                        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    t0, steps = time.perf_counter(), 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    return time.perf_counter() - t0, steps
cohort("warm")
runs = [cohort(f"r{k}") for k in range(3)]
wall, steps = min(runs)
print(json.dumps({"budget": budget, "cohort_s": round(wall, 3), "out_tok_s": round(C * 64 / wall, 1), "steps": steps,
                  "all_s": [round(w, 3) for w, _ in runs]}))
'''
if __name__ == "__main__":
    C = sys.argv[1]
    for rep in range(2):
        for b in sys.argv[2:]:
            out = subprocess.run([sys.executable, "-c", CHILD, C, b], capture_output=True, text=True)
            print(f"C={C}: {out.stdout.strip() or out.stderr[-800:]}", flush=True)
