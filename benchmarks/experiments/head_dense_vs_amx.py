"""The output head at bf16 past the dense crossover (max_ggml_rows): oneDNN's bf16 linear on the dense copy
(bf16 logits, as kept) against the AMX kernel's fp32 entry (fp32 logits), swapped in one process, 6
alternating offline runs of C requests of 200 random tokens -> 64 greedy; output tok/s.

    .venv/bin/python benchmarks/experiments/head_dense_vs_amx.py 256
"""
import random, time, statistics, torch
import tokenmill.layers.ggml_linear as gl
from tokenmill.entrypoints.llm import LLM
from tokenmill.sampling_params import SamplingParams
def old_apply(self, layer, x):
    m = x.shape[0]
    if m > self.max_ggml_rows and self._big_plain and layer.plain is not None and layer.packed is None:
        y = self._plain(layer, x)
    elif m > self.max_ggml_rows and (layer.dense_ok or layer.packed is not None):
        y = self._dense(layer, x)
    else:
        y = self._ggml(layer, x)
    return y if layer.bias is None else y + layer.bias
def new_apply(self, layer, x):  # the head past the crossover on the AMX kernel's fp32 entry
    if layer.wide_out and x.shape[0] > self.max_ggml_rows and self.uses_amx(layer, x.dtype, x.shape[0]):
        y = self._ggml(layer, x)
        return y if layer.bias is None else y + layer.bias
    return old_apply(self, layer, x)
llm = LLM(model="default", progress=False)
print("max_ggml_rows", llm.engine.executor.worker.model.lm_head.method.max_ggml_rows)
rng = random.Random(0)
import sys; C = int(sys.argv[1])
prompts = [[rng.randrange(100, 40000) for _ in range(200)] for _ in range(C)]
p = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
llm.generate(prompts[:8], p, use_tqdm=False)
T = {"old": [], "new": []}
for i in range(6):
    for tag in (("old", "new") if i % 2 == 0 else ("new", "old")):
        gl.GGUFLinearMethod.apply = old_apply if tag == "old" else new_apply
        s = time.perf_counter(); llm.generate(prompts, p, use_tqdm=False); T[tag].append(C * 64 / (time.perf_counter() - s))
for k, v in T.items(): print(k, " ".join(f"{x:.1f}" for x in v), "median", f"{statistics.median(v):.1f}")
print("new/old", statistics.median(T["new"]) / statistics.median(T["old"]))
seen = []
h = llm.engine.executor.worker.model.lm_head
orig = h.forward
h.forward = lambda x: (seen.append(x.shape[0]), orig(x))[1]
llm.generate(prompts, p, use_tqdm=False)
print("head rows max", max(seen), "steps with >64:", sum(1 for s in seen if s > 64))
