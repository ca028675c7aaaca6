"""Two builds of the block-matmul library, side by side in one process: the AMX kernel over L (3072, 576)
Q4_1 matrices (one per layer, as a step streams them) at 1 / 4 / 16 / 64 rows, interleaved, 15 rounds,
medians. For A/B of a kernel change: build each version (block_matmul.library() builds into a directory
named by the sources' hash and prints nothing; `python -c "from tokenmill.native import block_matmul as b;
print(b.library()._name)"` at each checkout gives its path).

    T=2 L=30 .venv/bin/python benchmarks/experiments/amx_ab.py OLD.so NEW.so
"""
import ctypes
import os
import statistics
import sys
import time

import torch

from tokenmill.layers.ggml_linear import to_blocks

_I32, _I64, _P = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
libs = []
for path in sys.argv[1:]:
    lib = ctypes.CDLL(path)
    lib.tm_amx_matmul.argtypes = [_I32, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _I32]
    lib.tm_amx_available.restype = _I32
    assert lib.tm_amx_available(), "no AMX here"
    libs.append(lib)
torch.manual_seed(0)
L, N, K = int(os.environ.get("L", "30")), 3072, 576
threads = int(os.environ.get("T", "1"))
bs = [to_blocks(torch.randn(N, K), "q4_1") for _ in range(L)]
for m in (1, 4, 16, 64):
    x, y = torch.randn(m, K), torch.empty(m, N)

    def run(lib: ctypes.CDLL) -> float:
        t = time.perf_counter()
        for b in bs:
            lib.tm_amx_matmul(3, b.data.ctypes.data, N, K, x.data_ptr(), K, m, y.data_ptr(), N, threads)
        return (time.perf_counter() - t) * 1e3

    for lib in libs:
        run(lib)
    times: list[list[float]] = [[] for _ in libs]
    for _ in range(15):
        for i, lib in enumerate(libs):
            times[i].append(run(lib))
    med = [statistics.median(t) for t in times]
    print(f"M={m} T={threads} L={L}: " + "  ".join(f"{v:.2f}" for v in med) + " ms;  first / each: "
          + " ".join(f"{med[0] / v:.2f}" for v in med))
