"""In one process, alternating blocks of 30 decode steps of one sequence: the MoE layers as before (torch's
routing, then grouped matmuls with torch's activation and sum; K-quant experts on the block kernel where the
loader put them; a shared expert in torch after) against the one-call path (tm_moe: router, routing, experts,
shared expert and sum in one native call).
Usage: ab_moe.py FILE.gguf (ROUNDS=8)."""
import sys, time, os, torch, statistics
from tokenmill import LLM, SamplingParams
from tokenmill.layers.moe import SparseMoE
llm = LLM(sys.argv[1], max_model_len=4096, progress=False)
eng = llm.engine
moes = [m for m in eng.executor.worker.model.modules() if isinstance(m, SparseMoE)]
layers = [l for m in moes for e in list(m.experts) + ([m.shared_expert] if m.shared_expert is not None else [])
          for l in (e.gate_up_proj, e.down_proj)]
saved = [l.block_mm for l in layers]
real = SparseMoE._one_call
p = SamplingParams(temperature=0, max_tokens=3500, ignore_eos=True)
eng.add_request("r", list(range(1000, 1064)), p)
for _ in range(8): eng.step()   # the one-call path decides (and drops block_mm where it does) here
dropped = [l.block_mm for l in layers]
print("one-call layers", sum(m._native is not None for m in moes), "of", len(moes),
      "; expert matrices (shared ones included) moved off the block kernel", sum(a is not None and b is None for a, b in zip(saved, dropped)))
res = {"before": [], "one call": []}
for r in range(int(os.environ.get("ROUNDS", 8))):
    for name in res:
        new = name == "one call"
        SparseMoE._one_call = real if new else (lambda self, h: None)
        for l, a, b in zip(layers, saved, dropped): l.block_mm = b if new else a
        for _ in range(3): eng.step()
        t = time.perf_counter()
        for _ in range(30): eng.step()
        res[name].append((time.perf_counter() - t) / 30 * 1e3)
for k, v in res.items(): print("%-9s decode step median %.2f ms  [%s]" % (k, statistics.median(v), " ".join("%.1f" % x for x in v)))
print("paired ratio before/one-call, median %.3f" % statistics.median([a / b for a, b in zip(res["before"], res["one call"])]))
