import os, sys, time, random, json, logging
logging.basicConfig(level=logging.INFO)
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
mode = sys.argv[1]; C = int(sys.argv[2]) if len(sys.argv) > 2 else 64
eng = LLMEngine(EngineConfig(model="default", dense_copy="off" if mode == "off" else "on"), progress=False)
rng = random.Random(0)
def run(n, tag):
    for i in range(n):
        eng.add_request(f"{tag}{i}", [rng.randrange(100, 40000) for _ in range(200)],
                        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    t = time.perf_counter(); steps = 0
    while eng.has_unfinished_requests():
        eng.step(); steps += 1
    return time.perf_counter() - t, steps
run(4, "w")
dt, steps = run(C, "r")
print(json.dumps({"mode": mode, "C": C, "out_tok_s": round(C * 64 / dt, 1), "s": round(dt, 1), "steps": steps, "max_rows": eng.__dict__.get("x")}))
