"""The AMX block kernel against the prepacked dense bf16 copy over 30 (3072, 576) Q4_1 matrices (one per
layer, as a step streams them), interleaved, 9 rounds, medians; 2 threads.

    .venv/bin/python benchmarks/experiments/amx_vs_dense.py
"""
import time, torch, statistics, sys
from tokenmill.native import block_matmul as bm
from tokenmill.layers.ggml_linear import to_blocks
from tokenmill.platforms.onednn import prepack, packed_linear
torch.manual_seed(0)
L = 30
ws = [torch.randn(3072, 576) for _ in range(L)]
bs = [to_blocks(w, "q4_1") for w in ws]
ps = [prepack(w.to(torch.bfloat16)) for w in ws]
torch.set_num_threads(2)
def once(fn):
    s = time.perf_counter(); fn(); return (time.perf_counter() - s) * 1e3
for m in (1, 4, 16, 32, 64):
    x = torch.randn(m, 576); y = torch.empty(m, 3072); xb = x.to(torch.bfloat16)
    fa = lambda: [bm.matmul(3, b.data.ctypes.data, 3072, 576, x.data_ptr(), m, y.data_ptr(), 3072, 2, amx=True) for b in bs]
    fd = lambda: [packed_linear(xb, p) for p in ps]
    fa(); fd()
    A, D = [], []
    for _ in range(9):
        A.append(once(fa)); D.append(once(fd))
    print(f"M={m}: amx median {statistics.median(A):.1f} (min {min(A):.1f})  onednn median {statistics.median(D):.1f} (min {min(D):.1f}) ms  ratio {statistics.median(D)/statistics.median(A):.2f}")
