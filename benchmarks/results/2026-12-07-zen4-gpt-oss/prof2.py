import os, time, collections
from tokenmill import LLM, SamplingParams
import tokenmill.native.ggml as G, tokenmill.native.block_matmul as B
acc = collections.Counter(); cnt = collections.Counter()
orig_call = G.GgmlMatmul.__call__
def call(self, x, m, y, t):
    s = time.perf_counter(); orig_call(self, x, m, y, t); acc[("ggml", self.weights[0].layout, self.k, self.out_features, m)] += time.perf_counter() - s; cnt[("ggml", self.weights[0].layout, self.k, self.out_features, m)] += 1
G.GgmlMatmul.__call__ = call
orig_bm = B.matmul
def bm(*a, **k):
    s = time.perf_counter(); r = orig_bm(*a, **k); acc[("block", a[0] if a else None)] += time.perf_counter() - s; cnt[("block", a[0] if a else None)] += 1; return r
B.matmul = bm
llm = LLM(os.path.expanduser("~/.cache/tokenmill/big/gpt-oss-20b-shape-MXFP4_MOE.gguf"), progress=False, max_model_len=4096, kv_cache_memory=2**30)
ids = list(range(1000, 1128))
llm.generate([ids], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
t = time.time(); llm.generate([ids], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)); pre = time.time() - t
acc.clear(); cnt.clear()
t = time.time(); llm.generate([ids], SamplingParams(temperature=0, max_tokens=33, ignore_eos=True)); tot = time.time() - t
steps = 32
print(f"decode {(tot-pre)/steps*1000:.1f} ms/token")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:12]:
    print(k, f"{v*1000/steps:.2f} ms/step over {cnt[k]/steps:.1f} calls/step (incl. prefill share)")
