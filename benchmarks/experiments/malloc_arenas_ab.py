"""Offline throughput with glibc's default arenas against one (MALLOC_ARENA_MAX=1, what tokenmill serve now asks
for: tokenmill/heap.py): 64 fresh requests of 200 random tokens -> 64 greedy, the default model, 3 runs a
process; run the two settings in alternating processes.

    for r in 1 2; do .venv/bin/python benchmarks/experiments/malloc_arenas_ab.py default
                     MALLOC_ARENA_MAX=1 .venv/bin/python benchmarks/experiments/malloc_arenas_ab.py arena1; done
"""
import random, time, sys
from tokenmill.entrypoints.llm import LLM
from tokenmill.sampling_params import SamplingParams
llm = LLM(model="default", progress=False)
rng = random.Random(0)
C = 64
prompts = [[rng.randrange(100, 40000) for _ in range(200)] for _ in range(C)]
p = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
llm.generate(prompts[:8], p, use_tqdm=False)
ts = []
for i in range(3):
    ps = [[rng.randrange(100, 40000) for _ in range(200)] for _ in range(C)]  # fresh prompts: prefill each time
    s = time.perf_counter(); llm.generate(ps, p, use_tqdm=False); ts.append(C * 64 / (time.perf_counter() - s))
print(sys.argv[1], " ".join(f"{x:.0f}" for x in ts))
