"""One stream, greedy, 128 tokens after a short prompt, best of 5 (MODEL: a GGUF path; unset: the default model).
Usage: one_stream.py LABEL."""
import os, sys, time
from tokenmill import LLM, SamplingParams
model = os.environ.get("MODEL")
llm = LLM(model, progress=False, max_model_len=2048) if model else LLM(progress=False)
p = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
llm.generate(["Hello"], SamplingParams(max_tokens=8), use_tqdm=False)
best = 1e9
for r in range(5):
    t = time.perf_counter(); llm.generate([f"Tell me a story number {r}."], p, use_tqdm=False); best = min(best, time.perf_counter() - t)
print(sys.argv[1], "one stream best of 5: %.1f tok/s" % (128 / best), flush=True)
