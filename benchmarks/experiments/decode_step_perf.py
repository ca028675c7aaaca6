"""A process to profile decode-only steps in: C requests of 200 random prompt tokens prefilled, then N greedy
tokens each (ignore_eos) decoded; it writes its pid to /tmp/prof/marker once the prompts are done, so a profiler
attaches to the decode-only steps alone, and prints the median step.

    mkdir -p /tmp/prof && .venv/bin/python benchmarks/experiments/decode_step_perf.py 64 300 &
    (wait for /tmp/prof/marker) perf record -g -o /tmp/prof/perf.data -p $(cat /tmp/prof/marker) -- sleep 12
    perf report -i /tmp/prof/perf.data --no-children --sort dso,symbol --stdio
"""
import random, sys, time, os
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
C = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
eng = LLMEngine(EngineConfig(model="default"), progress=False)
rng = random.Random(0)
for i in range(C):
    eng.add_request(f"r{i}", [rng.randrange(100, 40000) for _ in range(200)],
                    SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True))
while eng.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running):
    eng.step()
open("/tmp/prof/marker", "w").write(str(os.getpid()))
ts = []
while eng.has_unfinished_requests():
    s = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - s)
ts.sort(); print("decode steps", len(ts), "median ms", 1e3 * ts[len(ts)//2])
