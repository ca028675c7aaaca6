"""One stream's decode time per token on a GGUF (offline engine): a 128-token prompt, then 64 tokens; best of 3.
Usage: decode_tpot.py LABEL FILE.gguf. Run from a checkout (PYTHONPATH picks old or new code)."""
import sys
import time

from tokenmill import LLM, SamplingParams

llm = LLM(sys.argv[2], progress=False, max_model_len=1024, kv_cache_memory=2 * 2**30, enable_prefix_caching=False)
prompt = list(range(1000, 1128))
one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
many = SamplingParams(temperature=0, max_tokens=65, ignore_eos=True)
llm.generate([prompt], one, use_tqdm=False)
best = 1e9
for r in range(3):
    p = [t + r for t in prompt]
    t0 = time.perf_counter(); llm.generate([p], one, use_tqdm=False); t1 = time.perf_counter()
    llm.generate([p], many, use_tqdm=False); t2 = time.perf_counter()
    best = min(best, ((t2 - t1) - (t1 - t0)) / 64)  # the prefill's cost taken off (no prefix cache)
print(f"{sys.argv[1]} decode {best * 1000:.1f} ms/token", flush=True)
