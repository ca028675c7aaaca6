"""Would 8-bit arithmetic pay for big batches? (issue 10's C=16 / C=64 target against vLLM at bf16.)

1. Speed: oneDNN's int8 matmul (torch._int_mm: VNNI / AMX-INT8) against the prepacked bf16 linear the dense
   copy runs, over the default model's four layer shapes, 2 threads, medians of 21.
2. What it costs: teacher-forced top-1 agreement and median relative logit error against the fp32
   dequantized reference over 2,000 tokens (README + scheduler.py, as tests/model/test_gguf_method.py),
   for every dense-path matmul (all rows past the crossover: prefill and big batches) at
   - bf16: today's dense copy;
   - w8: weights rounded to int8 per output channel (from the bf16 copy), activations bf16;
   - w8a8: the same weights and activations rounded to int8 per token: what _int_mm computes.

    .venv/bin/python benchmarks/experiments/int8_arithmetic.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "model"))
from raw_forward import prompt_logits  # noqa: E402

from tokenmill import LLM  # noqa: E402
from tokenmill.layers.ggml_linear import GGUFLinearMethod  # noqa: E402
from tokenmill.layers.linear import Linear  # noqa: E402
from tokenmill.platforms.onednn import packed_linear, prepack  # noqa: E402

torch.set_num_threads(2)


def bench(f, n: int = 21) -> float:
    f(), f()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        f()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts) * 1e3


print("speed, the default model's (K, N) shapes summed:")
for M in (16, 64, 256, 512):
    tp = ti = 0.0
    for K, N in [(576, 960), (576, 576), (576, 3072), (1536, 576)]:
        pk, xb = prepack(torch.randn(N, K).bfloat16()), torch.randn(M, K).bfloat16()
        wi, xi = torch.randint(-127, 127, (K, N), dtype=torch.int8), torch.randint(-127, 127, (M, K), dtype=torch.int8)
        tp += bench(lambda: packed_linear(xb, pk))
        ti += bench(lambda: torch._int_mm(xi, wi))
    print(f"  M={M}: prepacked bf16 {tp:.3f} ms, int8 _int_mm {ti:.3f} ms: {tp / ti:.2f}x")

os.environ["TOKENMILL_GGML_MAX_ROWS"] = "0"  # every matmul on the dense path
ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32", quantization="dequantize")
ours = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="bfloat16", dense_copy="on")
root = Path(__file__).resolve().parents[2]
ids = ref.tokenizer.encode((root / "README.md").read_text() + (root / "tokenmill/engine/scheduler.py").read_text())
chunks = [ids[i : i + 250] for i in range(0, 2000 - 249, 250)]
model = ours.engine.executor.worker.runner.model
Q = {}
for lin in (m for m in model.modules() if isinstance(m, Linear) and m.packed is not None):
    wt = packed_linear(torch.eye(lin.in_features, dtype=torch.bfloat16), lin.packed).float()  # (K, N) = W^T
    sw = wt.abs().amax(0).clamp_min(1e-12) / 127
    Q[id(lin)] = ((wt / sw).round().clamp(-127, 127).to(torch.int8).contiguous(), sw)
dense, mode = GGUFLinearMethod._dense, {"m": "bf16"}


def patched(self, layer, x):
    if mode["m"] == "bf16" or id(layer) not in Q:
        return dense(self, layer, x)
    wq, sw = Q[id(layer)]
    xf = x.float()
    if mode["m"] == "w8":
        return (xf @ (wq.float() * sw)).to(x.dtype)
    sx = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
    return (torch._int_mm((xf / sx).round().to(torch.int8), wq).float() * sx * sw).to(x.dtype)


GGUFLinearMethod._dense = patched
print("accuracy against the fp32 dequantized reference, 2,000 tokens teacher-forced:")
for m in ("bf16", "w8", "w8a8"):
    mode["m"] = m
    agree = total = 0
    rels = []
    for c in chunks:
        r, g = prompt_logits(ref, c), prompt_logits(ours, c)
        rels.append(float(((r - g).norm(dim=-1) / r.norm(dim=-1)).median()))
        agree += int((r.argmax(-1) == g.argmax(-1)).sum())
        total += len(c)
    print(f"  {m}: top-1 {agree / total:.3f}, worst chunk's median relative logit error {max(rels):.1e}")
