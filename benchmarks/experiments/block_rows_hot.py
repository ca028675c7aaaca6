"""Two builds of native/block_matmul.cpp on one hot matrix (a (1536, 576) Q4_1 matrix of random blocks, which stays
in L2), 1-8 rows, one thread, alternating, medians of 7 x 200 calls: where the integer kernel's time per row goes
when memory is out of the way. Each build links the kquant_matmul.cpp beside it (or the package's).

    .venv/bin/python benchmarks/experiments/block_rows_hot.py OLD/block_matmul.cpp NEW/block_matmul.cpp [N K threads]

For the paired-rows attempt: `git apply benchmarks/experiments/block_pairs_shifts.patch` in a copy of the tree.
"""
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.native import block_matmul as bm
from tokenmill.native.compile import build_library

fns = []
for i, src in enumerate(sys.argv[1:3]):
    kq = Path(src).with_name("kquant_matmul.cpp")
    path = build_library(f"tm_hot_{i}", [src, str(kq if kq.exists() else bm.KQUANT_SOURCE)], bm.FLAGS)
    f = ctypes.CDLL(str(path)).tm_block_matmul
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    fns.append(f)
N, K, threads = (int(a) for a in (sys.argv[3:6] if len(sys.argv) > 5 else (1536, 576, 1)))
rng = np.random.default_rng(0)
nb = K // 32
W = np.zeros((N, nb, 20), np.uint8)
W[:, :, 4:] = rng.integers(0, 256, (N, nb, 16))
W[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
W[:, :, 2:4] = np.frombuffer(np.float16(-0.05).tobytes(), np.uint8)
for M in (1, 2, 3, 4, 6, 8):
    x = torch.randn(M, K)
    ys = [torch.empty(M, N) for _ in fns]
    T: list[list[float]] = [[] for _ in fns]
    for rep in range(7):
        for i in (range(len(fns)) if rep % 2 == 0 else reversed(range(len(fns)))):
            s = time.perf_counter()
            for _ in range(200):
                fns[i](3, W.ctypes.data, N, K, x.data_ptr(), K, M, ys[i].data_ptr(), N, threads)
            T[i].append((time.perf_counter() - s) / 200 * 1e6)
    a, b = (statistics.median(t) for t in T)
    print(f"M={M}: A {a:.1f} us  B {b:.1f} us  A/B {a / b:.2f}x  same bits {torch.equal(ys[0], ys[1])}", flush=True)
