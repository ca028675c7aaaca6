"""C concurrent requests of 128 random prompt tokens / 64 greedy output tokens, offline (all added at once, so
decode steps carry C rows), best of 3 rounds, new prompts each round (MODEL: a GGUF path). Usage: cohort.py LABEL C."""
import os, random, sys, time
from tokenmill import LLM, SamplingParams
C = int(sys.argv[2])
llm = LLM(os.environ["MODEL"], progress=False, max_model_len=2048)
rng = random.Random(0)
prompts = [[rng.randrange(100, 40000) for _ in range(128)] for _ in range(C)]
p = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
best = 1e9
for r in range(3):
    ps = [[(t + r * 7) % 40000 + 100 for t in x] for x in prompts]  # no prefix hits
    t = time.perf_counter(); llm.generate(ps, p, use_tqdm=False); best = min(best, time.perf_counter() - t)
print(sys.argv[1], "C=%d best of 3: %.2f s, %.1f out tok/s" % (C, best, C * 64 / best), flush=True)
