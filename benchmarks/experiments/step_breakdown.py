"""Where an offline step's time goes: 64 requests of 200 random tokens -> 64 greedy, the default model at
--dtype auto; wall time per step of the mixed (prefill + decode) steps and of the decode-only ones, split by
wrapping the kernels' Python entry points with timers (the rest is Python and torch glue).

    .venv/bin/python benchmarks/experiments/step_breakdown.py [C]
"""

from __future__ import annotations

import collections
import random
import sys
import time
from typing import Any

import tokenmill.attention.native_paged as native_paged
import tokenmill.attention.paged as paged
import tokenmill.layers.ggml_linear as ggml_linear
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams

T: dict[str, float] = collections.defaultdict(float)


def timed(mod: Any, name: str, key: str) -> None:
    f = getattr(mod, name)

    def g(*a: Any, **k: Any) -> Any:
        s = time.perf_counter()
        r = f(*a, **k)
        T[key] += time.perf_counter() - s
        return r

    setattr(mod, name, g)


# the native attention kernel: decodes, and (fp32) the prefill rows of chunks up to NATIVE_PREFILL_MAX_KEYS
for name, key in (("paged_decode_attention", "native attention"), ("add_rms_norm", "norms"),
                  ("silu_and_mul", "silu*mul"), ("rotary_", "rotary")):
    timed(native_paged.kernels, name, key)
# the dense path: the dense copy (oneDNN at bf16), or dequantize a tile + F.linear (fp32 without a copy)
timed(ggml_linear.GGUFLinearMethod, "_dense", "matmuls, dense path")
timed(ggml_linear.block_matmul, "matmul", "matmuls, blocks")
for mod in (paged,):
    timed(mod, "prefill_attention", "prefill attention, SDPA")
    timed(mod, "write_kv", "KV writes")
C = int(sys.argv[1]) if len(sys.argv) > 1 else 64
eng = LLMEngine(EngineConfig(model="default"), progress=False)
rng = random.Random(0)


def add(tag: str, n: int) -> None:
    for i in range(n):
        eng.add_request(f"{tag}{i}", [rng.randrange(100, 40000) for _ in range(200)],
                        SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))


add("warm", 4)
while eng.has_unfinished_requests():
    eng.step()
add("r", C)
for _ in range(4):
    eng.step()
for label, n in (("mixed", 3), ("decode-only", 5)):
    if label == "decode-only":
        while eng.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running):
            eng.step()
        eng.step()
    T.clear()
    t = time.perf_counter()
    for _ in range(n):
        eng.step()
    wall = (time.perf_counter() - t) / n
    parts = ", ".join(f"{k} {v / n * 1e3:.1f}" for k, v in sorted(T.items(), key=lambda kv: -kv[1]) if v / n > 5e-4)
    print(f"C={C} {label} step {wall * 1e3:.1f} ms: {parts}, other {(wall - sum(T.values()) / n) * 1e3:.1f} ms")
