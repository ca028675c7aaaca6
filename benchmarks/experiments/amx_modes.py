"""Where the AMX kernel's time goes at 1-64 rows, and three ways of dequantizing tried against it: the
kernel at HEAD (OLD.so) against a build with amx_dequant_variants.patch applied (NEW.so), whose
tm_set_mode(m) picks: 0 the 4-bit blocks dequantized by a lookup (both blocks' 16-value tables in one bf16
conversion, vpermw per block; the same bits as HEAD), 1 each 16 weight rows dequantized into a panel first
and then multiplied, 2+L dequantized L blocks ahead into a ring, 8 dequantization alone (no tile work),
9 the tile work alone (on a stale buffer). L (3072, 576) Q4_1 matrices, interleaved, 15 rounds, medians.

    git apply benchmarks/experiments/amx_dequant_variants.patch   # then build: block_matmul.library()
    T=1 L=30 .venv/bin/python benchmarks/experiments/amx_modes.py OLD.so NEW.so 0,1,3,5,8,9
"""
import ctypes, os, statistics, sys, time, torch
from tokenmill.layers.ggml_linear import to_blocks
_I32, _I64, _P = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
old = ctypes.CDLL(sys.argv[1]); new = ctypes.CDLL(sys.argv[2])
for l in (old, new): l.tm_amx_matmul.argtypes = [_I32, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _I32]
modes = [int(v) for v in sys.argv[3].split(",")]
torch.manual_seed(0)
L, N, K = int(os.environ.get("L", 30)), int(os.environ.get("N", 3072)), 576
T = int(os.environ.get("T", "2")); TY = int(os.environ.get("TY", "3")); name = {2: "q4_0", 3: "q4_1", 8: "q8_0"}[TY]
bs = [to_blocks(torch.randn(N, K), name) for _ in range(L)]
for m in (1, 4, 16, 64):
    x, y = torch.randn(m, K), torch.empty(m, N)
    def run(lib, mode):
        if mode is not None: lib.tm_set_mode(mode)
        t = time.perf_counter()
        for b in bs: lib.tm_amx_matmul(TY, b.data.ctypes.data, N, K, x.data_ptr(), K, m, y.data_ptr(), N, T)
        return (time.perf_counter() - t) * 1e3
    cands = [(old, None)] + [(new, md) for md in modes]
    for c in cands: run(*c)
    times = [[] for _ in cands]
    for _ in range(15):
        for i, c in enumerate(cands): times[i].append(run(*c))
    med = [statistics.median(t) for t in times]
    print(f"M={m} T={T} {name}: old {med[0]:.2f} | " + "  ".join(f"mode{md} {v:.2f} ({med[0]/v:.2f}x)" for md, v in zip(modes, med[1:])))
