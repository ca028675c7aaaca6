"""Cold read rate of one (n, k) matrix of a ggml type at one row, 120 copies cycled: our block kernel, ggml on
the plain blocks, ggml repacked (where it repacks the type), 1 and 2 threads. Usage: kernel_rates.py TYPE N K
(e.g. Q6_K 2048 1792, MXFP4 2880 2880, Q8_0 4096 2880)."""
import torch, numpy as np, time, sys
from tokenmill.native import ggml, block_matmul
from gguf import GGMLQuantizationType as Q
name = sys.argv[1] if len(sys.argv) > 1 else "Q6_K"
n, k = int(sys.argv[2]) if len(sys.argv) > 2 else 2048, int(sys.argv[3]) if len(sys.argv) > 3 else 1792
S = 120
qt = int(Q[name]); rs = ggml.row_size(qt, k)
w = (torch.randn(n, k) * 0.05).numpy()
one = np.empty((n, rs), np.uint8); ggml.quantize(qt, w.ctypes.data, one.ctypes.data, n, k)
srcs = [one.copy() for _ in range(S)]
plain = [ggml.GgmlWeight(qt, k, n, s.ctypes.data, False, s) for s in srcs]
rep = [ggml.GgmlWeight(qt, k, n, s.ctypes.data, True, s) for s in srcs]
print(name, n, k, "MB total %.0f" % (S * n * rs / 1e6), "repack layout:", rep[0].layout, rep[0].repacked)
x = torch.randn(1, k); y = torch.empty(1, n)
def run(kind, thr):
    t = time.perf_counter()
    for s in range(S):
        if kind == "block":
            block_matmul.matmul(qt, srcs[s].ctypes.data, n, k, x.data_ptr(), 1, y.data_ptr(), n, thr)
        elif kind == "ggml-plain":
            ggml.matmul_grouped([plain[s]], [1], x.data_ptr(), k, y.data_ptr(), n, thr)
        else:
            ggml.matmul_grouped([rep[s]], [1], x.data_ptr(), k, y.data_ptr(), n, thr)
    return time.perf_counter() - t
kinds = ["block", "ggml-plain"] + (["ggml-repacked"] if rep[0].repacked else [])
if not block_matmul.supports(qt): kinds.remove("block")
for r in range(2):
    for kind in kinds:
        for thr in (1, 2):
            run(kind, thr); dt = min(run(kind, thr) for _ in range(3))
            print("%-14s %d thr %.1f GB/s" % (kind, thr, S * n * rs / dt / 1e9))
