"""Offline decode-only step time at C requests (200 random prompt tokens, 64 greedy outputs, ignore_eos; the
median of the decode-only steps over 3 cohorts, best of the runs) and the whole cohort's wall time, for each
environment given, each in its own process, twice, alternating. It set _PACKED_STEP_ROWS (the native step on
the packed blocks against the layer path on the dense copy past its crossover) and checked one stream.

    .venv/bin/python benchmarks/experiments/decode_step_rows.py 16 A=1 TOKENMILL_VNNI_PACK=0
    .venv/bin/python benchmarks/experiments/decode_step_rows.py 1 A=1 TOKENMILL_VNNI_PACK=0 TOKENMILL_VNNI_MATMUL=0
"""
import json
import os
import subprocess
import sys

CHILD = r'''
import random, sys, time, json
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
C = int(sys.argv[1])
eng = LLMEngine(EngineConfig(model="default"), progress=False)
m = eng.executor.worker.model.lm_head.method
rng = random.Random(0)
def run(tag):
    for i in range(C):
        eng.add_request(f"{tag}{i}", [rng.randrange(100, 40000) for _ in range(200)],
                        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    dec, t0 = [], time.perf_counter()
    while eng.has_unfinished_requests():
        pre = eng.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running)
        s = time.perf_counter()
        eng.step()
        if not pre:
            dec.append(time.perf_counter() - s)
    return time.perf_counter() - t0, dec
run("warm")
walls, decs = [], []
for k in range(3):
    w, d = run(f"r{k}")
    walls.append(w)
    decs += d
decs.sort()
print(json.dumps({"max_ggml_rows": m.max_ggml_rows, "max_step_rows": m.max_step_rows, "cohort_s": round(min(walls), 3),
                  "decode_step_ms": round(1e3 * decs[len(decs) // 2], 2)}))
'''
if __name__ == "__main__":
    C = sys.argv[1]
    for rep in range(2):
        for cfg in sys.argv[2:]:
            env = dict(v.split("=", 1) for v in cfg.split(","))
            out = subprocess.run([sys.executable, "-c", CHILD, C], env=os.environ | env, capture_output=True, text=True)
            print(f"C={C} {cfg}: {out.stdout.strip() or out.stderr[-800:]}", flush=True)
