"""Our K-quant block kernel (native/kquant_matmul.cpp; its AVX2 code too, built with -DTM_NO_AVX512, and
the AMX kernel's fp32 entry where the CPU has AMX) against ggml's kernels on the same blocks: plain Q4_K /
Q6_K, and ggml's repacked Q4_K (what the loader gives it on this CPU), in 7B shapes (Qwen2.5-7B's layer
matrices: q, o, gate, up as Q4_K, down as Q6_K; TYPES=12 or 14 keeps one type, Q4K_AS=13 makes the Q4_K ones Q5_K), over LAYERS layers of
random blocks (beyond the caches), alternating kernels, medians of REPEATS; GB/s of weight bytes read.

    .venv/bin/python benchmarks/experiments/kquant_vs_ggml.py [threads]
"""
import os, statistics, sys, time
import numpy as np
import torch
from tokenmill.native import block_matmul as bm, ggml

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
LAYERS = int(os.environ.get("LAYERS", "6"))
REPEATS = int(os.environ.get("REPEATS", "7"))
D, I = 3584, 18944
SHAPES = [("q", 12, D, D), ("o", 12, D, D), ("gate", 12, I, D), ("up", 12, I, D), ("down", 14, D, I)]
if os.environ.get("Q4K_AS"):  # e.g. Q4K_AS=13: the Q4_K matrices as Q5_K (a Q5_K_M file's mix)
    SHAPES = [(n, int(os.environ["Q4K_AS"]) if t == 12 else t, a, b) for n, t, a, b in SHAPES]
TYPES = {int(t) for t in os.environ.get("TYPES", "12,14").split(",")}
SHAPES = [s for s in SHAPES if s[1] in TYPES]
AVX2 = bm.library(bm.FLAGS + ("-DTM_NO_AVX512",))

rng = np.random.default_rng(0)
mats = []  # (name, type, n, k, plain blocks, ggml plain weight, ggml repacked weight or None)
for layer in range(LAYERS):
    for name, t, n, k in SHAPES:
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.02)
        blocks = np.empty((n, ggml.row_size(t, k)), dtype=np.uint8)
        ggml.quantize(t, w.ctypes.data, blocks.ctypes.data, n, k)
        del w
        plain = ggml.GgmlWeight(t, k, n, blocks.ctypes.data, False, blocks)
        rep = ggml.GgmlWeight(t, k, n, blocks.ctypes.data, True, blocks)
        mats.append((name, t, n, k, blocks, plain, rep if rep.repacked else None))
total = sum(m[4].nbytes for m in mats)
print(f"{len(mats)} matrices, {total / 1e9:.2f} GB of blocks; repacked: "
      f"{sorted({m[0] for m in mats if m[6] is not None})} ({mats[2][6].layout if mats[2][6] else '-'})")


def ours(M, xs, ys):
    for name, t, n, k, blocks, _, _ in mats:
        bm.matmul(t, blocks.ctypes.data, n, k, xs[k].data_ptr(), M, ys[n].data_ptr(), n, threads)


def ours_avx2(M, xs, ys):
    for name, t, n, k, blocks, _, _ in mats:
        bm.matmul(t, blocks.ctypes.data, n, k, xs[k].data_ptr(), M, ys[n].data_ptr(), n, threads, AVX2)


def amx(M, xs, ys):
    for name, t, n, k, blocks, _, _ in mats:
        bm.matmul(t, blocks.ctypes.data, n, k, xs[k].data_ptr(), M, ys[n].data_ptr(), n, threads, amx=True)


def ggml_plain(M, xs, ys):
    for name, t, n, k, _, plain, _ in mats:
        ggml.GgmlMatmul([plain], [0], n)(xs[k].data_ptr(), M, ys[n].data_ptr(), threads)


def ggml_repacked(M, xs, ys):
    for name, t, n, k, _, plain, rep in mats:
        ggml.GgmlMatmul([rep or plain], [0], n)(xs[k].data_ptr(), M, ys[n].data_ptr(), threads)


kernels = {"ours": ours, "ours AVX2": ours_avx2, **({"AMX": amx} if bm.amx_available() else {}),
           "ggml plain": ggml_plain, "ggml repacked Q4_K": ggml_repacked}
for M in tuple(int(v) for v in os.environ.get("ROWS", "1,2,4,8").split(",")):
    xs = {k: torch.randn(M, k) for k in (D, I)}
    ys = {tag: {n: torch.empty(M, n) for n in (D, I)} for tag in kernels}
    T = {tag: [] for tag in kernels}
    for i in range(REPEATS + 1):
        order = list(kernels) if i % 2 == 0 else list(reversed(kernels))
        for tag in order:
            s = time.perf_counter()
            kernels[tag](M, xs, ys[tag])
            if i:
                T[tag].append(time.perf_counter() - s)
    # agreement with ggml on the last matrix of each shape (ggml's 8-bit activations: ~5e-3)
    ns = {n for _, _, n, *_ in mats}
    err = max(float((ys["ours"][n] - ys["ggml plain"][n]).norm() / ys["ggml plain"][n].norm()) for n in ns)
    line = ", ".join(f"{tag} {statistics.median(v) * 1e3:.1f} ms ({total / statistics.median(v) / 1e9:.1f} GB/s)"
                     for tag, v in T.items())
    print(f"M={M}: {line}; ours/ggml-repacked speed {statistics.median(T['ggml repacked Q4_K']) / statistics.median(T['ours']):.2f}x; "
          f"rel. diff vs ggml {err:.1e}")
