"""Where a one-stream decode step goes (128-token prompt, then timed decode steps), Granite 4.0-H or LFM2-MoE.
Usage: decode_parts.py FILE.gguf [steps]. Times (ms per step, summed over layers; nested: "mixer total" includes
its projections and torch ops, "moe total" includes its experts):
- granitehybrid: mamba2 in_proj / out_proj (matmuls), conv (causal_conv1d), scan (mamba2_scan), gated norm,
  the rest of the mixer (splits, unflatten) = mixer total - those; attention total; moe (SparseMoE) total;
- lfm2moe: shortconv in_proj / out_proj, conv, the rest; attention; dense MLP; moe;
- moe: route, the grouped experts, the shared MLP (granitehybrid), the rest (sort, gather, scatter, weighted sum);
- lm_head (compute_logits), model forward, and the step (sampling, scheduling: step - forward - moe: route, the grouped experts, the shared MLP (granitehybrid), the rest (sort, gather, scatter, weighted sum);
- lm_head)."""
import collections
import sys
import time

import torch

import tokenmill.models.granite_hybrid as GH
import tokenmill.models.lfm2 as LF
from tokenmill import LLM, SamplingParams
from tokenmill.layers.moe import SparseMoE
from tokenmill.models.llama import LlamaAttention, LlamaMLP

acc: dict[str, float] = collections.defaultdict(float)


def timed(f, label):
    def w(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[label] += time.perf_counter() - t
        return r
    return w


for mod in (GH, LF):
    mod.causal_conv1d = timed(mod.causal_conv1d, "mixer: conv")
GH.mamba2_scan = timed(GH.mamba2_scan, "mixer: scan")
GH.gated_rms_norm = timed(GH.gated_rms_norm, "mixer: gated norm")

llm = LLM(sys.argv[1], max_model_len=2048, progress=False)
eng = llm.engine
model = eng.executor.worker.model
for m in model.modules():
    if isinstance(m, (GH.Mamba2Mixer, LF.ShortConv)):
        m.forward = timed(m.forward, "mixer total")
        m.in_proj.forward = timed(m.in_proj.forward, "mixer: in_proj")
        m.out_proj.forward = timed(m.out_proj.forward, "mixer: out_proj")
    elif isinstance(m, LlamaAttention):
        m.forward = timed(m.forward, "attention total")
    elif isinstance(m, SparseMoE):
        m.forward = timed(m.forward, "moe total")
        m.route = timed(m.route, "moe: route (router matmul, scores, top-k)")
        m._one_call = timed(m._one_call, "moe: one call (router, routing, experts, shared, sum)")
        if m.shared_expert is not None:
            m.shared_expert.forward = timed(m.shared_expert.forward, "moe: shared MLP")
    elif isinstance(m, LlamaMLP):
        m.forward = timed(m.forward, "dense mlp")
model.forward = timed(model.forward, "model forward")
model.compute_logits = timed(model.compute_logits, "lm_head")
p = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
eng.add_request("r", list(range(1000, 1128)), p)
for _ in range(4):
    eng.step()
acc.clear()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
t = time.perf_counter()
for _ in range(n):
    eng.step()
tot = (time.perf_counter() - t) / n
parts = {k: v / n * 1e3 for k, v in acc.items()}
named = sum(v for k, v in parts.items() if k.startswith("mixer: "))
parts["mixer: rest (splits, views, muls)"] = parts.get("mixer total", 0) - named
if "moe total" in parts:
    parts["moe: rest (argsort, bincount, gather, scatter, mix)"] = parts["moe total"] - sum(
        v for k, v in parts.items() if k.startswith("moe: "))
parts["step outside forward + lm_head"] = tot * 1e3 - parts["model forward"] - parts["lm_head"]
parts["forward outside mixer / attention / mlp"] = parts["model forward"] - sum(
    parts.get(k, 0) for k in ("mixer total", "attention total", "moe total", "dense mlp"))
print(f"{sys.argv[1]}: decode step {tot * 1e3:.2f} ms (torch threads {torch.get_num_threads()})")
for k in sorted(parts, key=lambda k: -parts[k]):
    print(f"  {k:42s} {parts[k]:8.2f} ms  {100 * parts[k] / (tot * 1e3):5.1f}%")
