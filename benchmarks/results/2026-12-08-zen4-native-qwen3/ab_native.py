"""In one process, alternating blocks of 30 decode steps of one sequence (or of C sequences): the decode step
layer by layer with Qwen3's q / k norms in torch (as before this change) against the native decode step (every
layer in one foreign call: q / k norms on the native kernel, each MoE layer's experts in one tm_moe call).
Usage: ab_native.py FILE.gguf [C] (ROUNDS=8)."""
import os, statistics, sys, time

from tokenmill import LLM, SamplingParams
from tokenmill.layers.head_norm import HeadRMSNorm
from tokenmill.native import decode_step

C = int(sys.argv[2]) if len(sys.argv) > 2 else 1
llm = LLM(sys.argv[1], max_model_len=4096, progress=False)
eng = llm.engine
model = eng.executor.worker.model
print("native decode step:", model.native_decode is not None)
norms = [m for m in model.modules() if isinstance(m, HeadRMSNorm)]
p = SamplingParams(temperature=0, max_tokens=3500, ignore_eos=True)
for i in range(C):
    eng.add_request(f"r{i}", list(range(1000 + i, 1064 + i)), p)
for _ in range(8):
    eng.step()
res: dict[str, list[float]] = {"layer by layer": [], "native step": []}
for r in range(int(os.environ.get("ROUNDS", 8))):
    for name in res:
        new = name == "native step"
        os.environ[decode_step.ENV_SWITCH] = "1" if new else "0"
        for n in norms:
            n.use_native = new
        for _ in range(3):
            eng.step()
        t = time.perf_counter()
        for _ in range(30):
            eng.step()
        res[name].append((time.perf_counter() - t) / 30 * 1e3)
for k, v in res.items():
    print("%-14s C=%d decode step median %.2f ms  [%s]" % (k, C, statistics.median(v), " ".join("%.1f" % x for x in v)))
print("paired ratio before/after, median %.3f" % statistics.median([a / b for a, b in zip(*res.values())]))
