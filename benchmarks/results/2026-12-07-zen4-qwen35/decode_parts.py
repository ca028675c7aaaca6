import time, torch, sys, collections
import tokenmill.models.qwen3_5 as Q
import tokenmill.layers.gated_delta as G
from tokenmill import LLM, SamplingParams
acc = collections.defaultdict(float)
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; return r
    setattr(obj, name, w)
wrap(Q, "causal_conv1d", "conv"); wrap(Q, "gated_delta_rule", "delta")
real_fwd = Q.GatedDeltaNet.forward
def gdn(self, h, step):
    t = time.perf_counter(); r = real_fwd(self, h, step); acc["gdn total"] += time.perf_counter() - t; return r
Q.GatedDeltaNet.forward = gdn
real_att = Q.Qwen3_5Attention.forward
def att(self, *a):
    t = time.perf_counter(); r = real_att(self, *a); acc["attn total"] += time.perf_counter() - t; return r
Q.Qwen3_5Attention.forward = att
path = sys.argv[1]
llm = LLM(path, max_model_len=2048, progress=False)
eng = llm.engine
model = eng.executor.worker.model
for i, layer in enumerate(model.model.layers):
    m = layer.mlp
    f = m.forward
    def mk(f):
        def w(*a):
            t = time.perf_counter(); r = f(*a); acc["mlp"] += time.perf_counter() - t; return r
        return w
    m.forward = mk(f)
p = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
eng.add_request("r", list(range(1000, 1128)), p)
for _ in range(3): eng.step()
acc.clear(); n = 10
t = time.perf_counter()
for _ in range(n): eng.step()
tot = (time.perf_counter() - t) / n
print(f"step {tot*1e3:.1f} ms; " + ", ".join(f"{k} {v/n*1e3:.1f}" for k, v in acc.items()))
