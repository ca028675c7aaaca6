"""The AMX block kernel against the integer block kernel (8-bit activations, AVX-512 VNNI) at 1-16 rows,
over 30 (3072, 576) Q4_1 matrices (one per layer, as a decode step streams them), interleaved, 9 rounds,
medians; 2 threads. Where the AMX kernel starts to pay is block_matmul.AMX_MIN_ROWS.

    .venv/bin/python benchmarks/experiments/amx_vs_integer.py
"""
import statistics
import time

import torch

from tokenmill.layers.ggml_linear import to_blocks
from tokenmill.native import block_matmul as bm

torch.manual_seed(0)
L = 30
ws = [torch.randn(3072, 576) for _ in range(L)]
bs = [to_blocks(w, "q4_1") for w in ws]
torch.set_num_threads(2)


def once(fn):
    s = time.perf_counter()
    fn()
    return (time.perf_counter() - s) * 1e3


for m in (1, 2, 3, 4, 5, 6, 8, 9, 12, 16):
    x = torch.randn(m, 576)
    y = torch.empty(m, 3072)
    fa = lambda: [bm.matmul(3, b.data.ctypes.data, 3072, 576, x.data_ptr(), m, y.data_ptr(), 3072, 2, amx=True)
                  for b in bs]
    fi = lambda: [bm.matmul(3, b.data.ctypes.data, 3072, 576, x.data_ptr(), m, y.data_ptr(), 3072, 2, amx=False)
                  for b in bs]
    fa(), fi()
    A, I = [], []
    for _ in range(9):
        A.append(once(fa))
        I.append(once(fi))
    print(f"M={m}: amx {statistics.median(A):.2f} ms  integer {statistics.median(I):.2f} ms  "
          f"integer/amx {statistics.median(I) / statistics.median(A):.2f}")
