"""Without the dense bf16 copy (--dense-copy off: what a model past 1/8 of the RAM gets), blocks packed for the 16-bit
VNNI kernel (TOKENMILL_VNNI_PACK unset) against plain (=0), one process per setting: one stream (128 tokens, best of
3), a 1000-token prompt (max_tokens 1, best of 3: the prefill's big batches) and 8 requests of 128 -> 64 at once
(best of 2). MODEL: a GGUF path (unset: the default model). Usage: no_copy_ab.py LABEL."""
import os, random, sys, time
from tokenmill import LLM, SamplingParams
model = os.environ.get("MODEL")
kw = dict(progress=False, max_model_len=2048, dense_copy="off")
llm = LLM(model, **kw) if model else LLM(**kw)
rng = random.Random(0)
g = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
llm.generate(["Hello"], SamplingParams(max_tokens=8), use_tqdm=False)
best = 1e9
for r in range(3):
    t = time.perf_counter(); llm.generate([f"Tell me a story number {r}."], g, use_tqdm=False); best = min(best, time.perf_counter() - t)
one = 128 / best
best = 1e9
for r in range(3):
    ids = [rng.randrange(100, 40000) for _ in range(1000)]
    t = time.perf_counter(); llm.generate([ids], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False); best = min(best, time.perf_counter() - t)
prompt = 1000 / best
best = 1e9
for r in range(2):
    ps = [[rng.randrange(100, 40000) for _ in range(128)] for _ in range(8)]
    t = time.perf_counter(); llm.generate(ps, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False); best = min(best, time.perf_counter() - t)
print(sys.argv[1], "one stream %.1f tok/s, prompt %.0f tok/s, 8 x 128 -> 64 %.1f out tok/s" % (one, prompt, 8 * 64 / best), flush=True)
