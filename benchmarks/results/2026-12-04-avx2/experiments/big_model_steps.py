import time, random, sys, collections, os
import tokenmill.models.native_decode as nd
import tokenmill.layers.ggml_linear as gl
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
T = collections.defaultdict(float)
def timed(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        s = time.perf_counter(); r = f(*a, **k); T[key] += time.perf_counter() - s; return r
    setattr(obj, name, g)
timed(nd.decode_step, "run", "native step")
if os.environ.get("NONATIVE"): nd.decode_step.available = lambda: False
timed(gl.GGUFLinearMethod, "_ggml", "ggml (outside native)")
eng = LLMEngine(EngineConfig(model=os.path.expanduser("~/.cache/tokenmill/big/qwen2.5-7b-shape-Q4_K_M.gguf"), max_model_len=1024, kv_cache_memory=1<<30), progress=False)
rng = random.Random(0)
eng.add_request("a", [rng.randrange(100, 40000) for _ in range(int(os.environ.get("PL", 16)))], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
eng.step()
ts = []
while eng.has_unfinished_requests():
    T.clear(); s = time.perf_counter(); eng.step(); ts.append((time.perf_counter() - s, dict(T)))
ts = ts[2:]
n = len(ts)
import statistics
print("per-step ms", [round(t*1e3) for t, _ in ts])
print("steps", n, "mean step ms %.1f" % (sum(t for t, _ in ts) / n * 1e3),
      {k: round(sum(d.get(k, 0) for _, d in ts) / n * 1e3, 1) for k in ts[0][1]})
