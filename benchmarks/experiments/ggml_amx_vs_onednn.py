"""ggml's own AMX matmul (its "AMX" extra buffer: int8 activations on the tile unit, weights repacked from
the blocks) against the prepacked dense bf16 copy on oneDNN (what the mixed prefill steps use now), over 30
Q4_1 matrices per shape (one per layer, as a step streams them), interleaved, 7 rounds, medians; 2 threads.
Also the relative error of each against the fp32 product with the dequantized weights.

Result on the AMX Xeon (2026-12-03 evening): ggml's AMX path crashes (SIGSEGV in ggml_graph_compute) at 64
rows for Q4_0, Q4_1 and Q8_0 alike, as llama-server's did at its first decode; at 1 row it runs (ggml's
vec-dot fallback). So the shim keeps AMX layouts off (TOKENMILL_GGML_AMX) and nothing was timed.

    .venv/bin/python benchmarks/experiments/ggml_amx_vs_onednn.py
"""
import os
import statistics
import time

os.environ["TOKENMILL_GGML_AMX"] = "1"
import torch

from tokenmill.layers.ggml_linear import to_blocks
from tokenmill.native import ggml
from tokenmill.platforms.onednn import packed_linear, prepack

torch.manual_seed(0)
torch.set_num_threads(2)
L = 30
Q4_1 = 3


def once(fn):
    s = time.perf_counter()
    fn()
    return (time.perf_counter() - s) * 1e3


for n, k in ((1536, 576), (576, 1536), (576, 576)):
    ws = [torch.randn(n, k) * 0.05 for _ in range(L)]
    bs = [to_blocks(w, "q4_1") for w in ws]
    deq = []
    for b in bs:
        out = torch.empty(n, k)
        ggml.dequantize(Q4_1, b.data.ctypes.data, n, k, out.data_ptr())
        deq.append(out)
    gw = [ggml.GgmlWeight(Q4_1, k, n, b.data.ctypes.data, True, b) for b in bs]
    gm = [ggml.GgmlMatmul([w], [0], n) for w in gw]
    ps = [prepack(d.to(torch.bfloat16)) for d in deq]
    print(f"shape ({n}, {k}): ggml layout {gw[0].layout!r}")
    for m in (64, 128, 256, 512):
        x = torch.randn(m, k)
        xb = x.to(torch.bfloat16)
        y = torch.empty(m, n)
        fg = lambda: [g(x.data_ptr(), m, y.data_ptr(), 2) for g in gm]
        fd = lambda: [packed_linear(xb, p) for p in ps]
        gm[0](x.data_ptr(), m, y.data_ptr(), 2)
        ref = x @ deq[0].T
        eg = float((y - ref).norm() / ref.norm())
        ed = float((packed_linear(xb, ps[0]).float() - ref).norm() / ref.norm())
        fg(); fd()
        G, D = [], []
        for _ in range(7):
            G.append(once(fg)); D.append(once(fd))
        g_, d_ = statistics.median(G), statistics.median(D)
        print(f"  M={m}: ggml {g_:.1f} ms  onednn bf16 {d_:.1f} ms  onednn/ggml {d_ / g_:.2f}  "
              f"rel err ggml {eg:.1e} bf16 {ed:.1e}")
