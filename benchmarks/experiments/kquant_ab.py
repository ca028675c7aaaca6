"""A/B two builds of the K-quant block kernel (OLD_DIR's and NEW_DIR's block_matmul.cpp, amx_matmul.cpp,
panel_matmul.cpp and kquant_matmul.cpp) in one process, over LAYERS layers of random Q4_K / Q6_K blocks in
Qwen2.5-7B's shapes (q, o, gate, up as Q4_K, down as Q6_K; TYPES=12 or 14 keeps one type, Q4K_AS=13 makes the
Q4_K ones Q5_K), alternating builds, medians of REPEATS; GB/s of weight bytes read. AVX2=1 builds both with
-DTM_NO_AVX512 (their 256-bit code). Also the largest relative difference between the two builds' outputs.

    .venv/bin/python benchmarks/experiments/kquant_ab.py OLD_DIR NEW_DIR [threads]
"""
import ctypes, os, statistics, sys, time
from pathlib import Path
import numpy as np
import torch
from tokenmill.native import block_matmul as bm, ggml
from tokenmill.native.compile import build_library

old_dir, new_dir = Path(sys.argv[1]), Path(sys.argv[2])
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
LAYERS = int(os.environ.get("LAYERS", "4"))
REPEATS = int(os.environ.get("REPEATS", "7"))
ROWS = tuple(int(v) for v in os.environ.get("ROWS", "1,2,4,8,16").split(","))
FLAGS = bm.FLAGS + (("-DTM_NO_AVX512",) if os.environ.get("AVX2") == "1" else ())
D, I = 3584, 18944
SHAPES = [("q", 12, D, D), ("o", 12, D, D), ("gate", 12, I, D), ("up", 12, I, D), ("down", 14, D, I)]
if os.environ.get("Q4K_AS"):
    SHAPES = [(n, int(os.environ["Q4K_AS"]) if t == 12 else t, a, b) for n, t, a, b in SHAPES]
TYPES = {int(t) for t in os.environ.get("TYPES", "12,14").split(",")}
SHAPES = [s for s in SHAPES if s[1] in TYPES]

fns = {}
for tag, d in (("old", old_dir), ("new", new_dir)):
    names = [bm.SOURCE.name, bm.AMX_SOURCE.name, bm.PANEL_SOURCE.name, bm.KQUANT_SOURCE.name]
    lib = ctypes.CDLL(str(build_library("tm_kq_ab_" + tag, [d / n for n in names], FLAGS)))
    f = lib.tm_block_matmul
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    fns[tag] = f

rng = np.random.default_rng(0)
mats = []
for layer in range(LAYERS):
    for name, t, n, k in SHAPES:
        w = rng.standard_normal((n, k), dtype=np.float32) * 0.02
        blocks = np.empty((n, ggml.row_size(t, k)), dtype=np.uint8)
        ggml.quantize(t, w.ctypes.data, blocks.ctypes.data, n, k)
        mats.append((t, n, k, blocks))
total = sum(m[3].nbytes for m in mats)
print(f"{len(mats)} matrices, {total / 1e9:.2f} GB of blocks, flags {' '.join(FLAGS)}, {threads} threads")


def run(tag, M, xs, ys):
    for t, n, k, blocks in mats:
        rc = fns[tag](t, blocks.ctypes.data, n, k, xs[k].data_ptr(), k, M, ys[n].data_ptr(), n, threads)
        assert rc == 0, rc


for M in ROWS:
    xs = {k: torch.randn(M, k) for _, _, k, _ in mats}
    ya = {n: torch.empty(M, n) for _, n, _, _ in mats}
    yb = {n: torch.empty(M, n) for _, n, _, _ in mats}
    run("old", M, xs, ya)
    run("new", M, xs, yb)
    diff = max(float((ya[n] - yb[n]).norm() / ya[n].norm()) for n in ya)
    T = {"old": [], "new": []}
    for i in range(REPEATS):
        for tag in (("old", "new") if i % 2 == 0 else ("new", "old")):
            s = time.perf_counter()
            run(tag, M, xs, ya if tag == "old" else yb)
            T[tag].append(time.perf_counter() - s)
    a, b = statistics.median(T["old"]), statistics.median(T["new"])
    print(f"M={M:2d}: old {total / a / 1e9:5.1f} GB/s, new {total / b / 1e9:5.1f} GB/s, new/old {a / b:.2f}x, "
          f"outputs differ by {diff:.1e} (relative)")
