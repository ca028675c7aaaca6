"""The fp32 panel kernel (native/panel_matmul.cpp) against the integer block kernel (native/block_matmul.cpp)
on random Q4_1 layers of the default model's shapes: 30 different layers a shape in turn (so the weights
stream from memory as in a step), 2 threads, best of 5, GFLOPS-equivalent (2 M N K / time), and each
kernel's largest relative error against x . dequantized(W)^T.

    .venv/bin/python benchmarks/experiments/panel_matmul.py [ROWS,...]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from tokenmill.native import block_matmul

Q4_1 = 3
ROWS = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8, 16, 24, 32, 64, 512]
SHAPES = [(3072, 576), (960, 576), (576, 576), (576, 1536)]  # (N, K): gate_up, qkv, o, down
LAYERS, THREADS = 30, 2
rng = np.random.default_rng(0)


def random_q4_1(n: int, k: int) -> np.ndarray:
    """(n, k/32 * 20) bytes of Q4_1 blocks: f16 scale, f16 min, 16 bytes of nibbles."""
    nb = k // 32
    blk = np.zeros((n, nb, 20), np.uint8)
    blk[:, :, 0:2] = (rng.random((n, nb)) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    blk[:, :, 2:4] = (-rng.random((n, nb)) * 0.08).astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    blk[:, :, 4:] = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
    return blk.reshape(n, -1).copy()


def dequantize(b: np.ndarray, n: int, k: int) -> torch.Tensor:
    b = b.reshape(n, k // 32, 20)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    m = b[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[:, :, 4:] & 15, b[:, :, 4:] >> 4], -1).astype(np.float32)
    return torch.from_numpy((q * d + m).reshape(n, k))


def best(fn, reps: int = 5) -> float:
    t = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


torch.set_num_threads(THREADS)
for n, k in SHAPES:
    ws = [random_q4_1(n, k) for _ in range(LAYERS)]
    w0 = dequantize(ws[0], n, k)
    for m in ROWS:
        x, y = torch.randn(m, k), torch.empty(m, n)
        ref = x @ w0.T
        line = [f"({n}, {k}) M={m:4d}"]
        for name, panel in (("panel", True), ("blocks", False)):
            def call(w: np.ndarray, panel: bool = panel) -> None:
                block_matmul.matmul(Q4_1, w.ctypes.data, n, k, x.data_ptr(), m, y.data_ptr(), n, THREADS, panel=panel)

            call(ws[0])
            err = float((y - ref).abs().max() / ref.abs().max())
            t = best(lambda: [call(w) for w in ws])
            line.append(f"{name} {t * 1e3:7.2f} ms {2 * m * n * k * LAYERS / t / 1e9:5.0f} GFLOPS (err {err:.0e})")
        print(" | ".join(line), flush=True)
