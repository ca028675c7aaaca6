"""Plain blocks against ggml's repacked layout, per type and row count, on the libggml tokenmill builds
(ggml 0.25.3 from llama-cpp-python's sdist: plain K-quant blocks are multiplied in tiles for a big enough
batch). One (N, K) matrix per type, 2 threads, best of 5 calls, layouts alternating within each row count.

    python benchmarks/experiments/ggml_repack_rule.py [--shape N K] [--types q4_k q6_k q4_0 ...]
"""
import argparse
import time

import torch

from tokenmill.layers.ggml_linear import to_blocks
from tokenmill.native import ggml

TYPE_IDS = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q8_0": 8, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13,
            "q6_k": 14, "iq4_nl": 20}
ap = argparse.ArgumentParser()
ap.add_argument("--shape", type=int, nargs=2, default=[18944, 3584])
ap.add_argument("--types", nargs="+", default=["q4_k", "q6_k", "q4_0", "q8_0"])
ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 128, 512])
args = ap.parse_args()
n, k = args.shape
print("shim:", ggml.lib()._name)
torch.manual_seed(0)
for t in args.types:
    b = to_blocks(torch.randn(n, k) * 0.02, t)
    layouts = {}
    for repack in (False, True):
        gw = ggml.GgmlWeight(TYPE_IDS[t], k, n, b.data.ctypes.data, repack, b)
        layouts[gw.layout or "plain"] = ggml.GgmlMatmul([gw], [0], n)
    for m in args.rows:
        x, y = torch.randn(m, k), torch.empty(m, n)
        best = {name: float("inf") for name in layouts}
        for _ in range(5):
            for name, mm in layouts.items():
                s = time.perf_counter()
                mm(x.data_ptr(), m, y.data_ptr(), 2)
                best[name] = min(best[name], time.perf_counter() - s)
        line = "  ".join(f"{name}: {best[name] * 1e3:8.2f} ms {2 * n * k * m / best[name] / 1e9:5.0f} GFLOPS"
                         for name in layouts)
        print(f"{t} M={m:4d}  {line}", flush=True)
