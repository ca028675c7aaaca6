"""The AMX int8 attempt (benchmarks/experiments/amx_int8_matmul.cpp: 16-bit x as two 8-bit tiles, the weights'
integers in the tiles, per-block scales on the vector unit) against the shipped kernels on one hot (1536, 576)
matrix of random Q4_0 / Q4_1 / Q8_0 blocks: its error against the integer kernel (the same integer sums, so only
float rounding), a row alone against the same row in the batch, and times (one thread by default, medians of 5 x 50
calls). FAKE_B=1 builds it with the weight tiles formed once and reused: the tile unit's own cost.

    .venv/bin/python benchmarks/experiments/amx_int8_vs.py [threads]
"""
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tokenmill.native import block_matmul as bm
from tokenmill.native.compile import build_library

src = Path(__file__).with_name("amx_int8_matmul.cpp")
flags = bm.FLAGS + (("-DTM_FAKE_B",) if os.environ.get("FAKE_B") == "1" else ())
lib = ctypes.CDLL(str(build_library("tm_amx8_try", [*map(str, bm.SOURCES), str(src)], flags)))
AT = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
      ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
fns = {}
for name in ("tm_block_matmul", "tm_amx_matmul", "tm_amx8_matmul"):
    f = getattr(lib, name)
    f.argtypes = AT
    fns[name] = f
assert lib.tm_amx8_available(), "no AMX-INT8 here"
rng = np.random.default_rng(0)


def blocks(t: int, N: int, K: int) -> np.ndarray:
    nb = K // 32
    if t == 8:
        b = np.zeros((N, nb, 34), np.uint8)
        b[:, :, 2:] = rng.integers(0, 256, (N, nb, 32))
        b[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        return b
    bb = 20 if t == 3 else 18
    b = np.zeros((N, nb, bb), np.uint8)
    b[:, :, bb - 16:] = rng.integers(0, 256, (N, nb, 16))
    b[:, :, 0:2] = (rng.random((N, nb)) * 0.02 + 0.001).astype(np.float16).view(np.uint8).reshape(N, nb, 2)
    if t == 3:
        b[:, :, 2:4] = (-rng.random((N, nb)) * 0.1).astype(np.float16).view(np.uint8).reshape(N, nb, 2)
    return b


threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
N, K = 1536, 576
for t in (2, 3, 8):
    W = blocks(t, N, K)
    for M in (1, 2, 3, 4, 7, 8, 16, 33):
        x = torch.randn(M, K)
        ys = {}
        for name, f in fns.items():
            ys[name] = torch.full((M, N), float("nan"))
            assert f(t, W.ctypes.data, N, K, x.data_ptr(), K, M, ys[name].data_ptr(), N, threads) == 0, name
        ref = ys["tm_block_matmul"]
        err = float((ys["tm_amx8_matmul"] - ref).norm() / ref.norm())
        one = torch.empty(1, N)
        fns["tm_amx8_matmul"](t, W.ctypes.data, N, K, x[M - 1:].data_ptr(), K, 1, one.data_ptr(), N, threads)
        times = {}
        for name, f in fns.items():
            ts = []
            for _ in range(5):
                s = time.perf_counter()
                for _ in range(50):
                    f(t, W.ctypes.data, N, K, x.data_ptr(), K, M, ys[name].data_ptr(), N, threads)
                ts.append((time.perf_counter() - s) / 50 * 1e6)
            times[name] = statistics.median(ts)
        print(f"type {t} M={M}: rel. error {err:.1e}, row alone == in batch {torch.equal(one[0], ys['tm_amx8_matmul'][M - 1])}; "
              + ", ".join(f"{k[3:]} {v:.1f} us" for k, v in times.items()), flush=True)
