import sys, time
from tokenmill import LLM, SamplingParams
llm = LLM(progress=False)
p = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
llm.generate(["Hello"], SamplingParams(max_tokens=8), use_tqdm=False)
best = 1e9
for r in range(5):
    t = time.perf_counter(); llm.generate([f"Tell me a story number {r}."], p, use_tqdm=False); best = min(best, time.perf_counter() - t)
print(sys.argv[1], "one stream best of 5: %.1f tok/s" % (128 / best), flush=True)
