import statistics, time, numpy as np, torch
from tokenmill.native import block_matmul as bm, ggml
libs = {"default": None, "no-vnni": bm.library(bm.FLAGS + ("-mno-avx512vnni",)), "avx2": bm.library(bm.FLAGS + ("-DTM_NO_AVX512",))}
rng = np.random.default_rng(0)
D, I = 3584, 18944
mats = []
for layer in range(4):
    for n, k in ((D, D), (I, D), (I, D), (D, D)):
        w = rng.standard_normal((n, k), dtype=np.float32) * 0.02
        b = np.empty((n, ggml.row_size(8, k)), dtype=np.uint8); ggml.quantize(8, w.ctypes.data, b.ctypes.data, n, k)
        mats.append((n, k, b))
total = sum(m[2].nbytes for m in mats)
for M in (1, 2, 4, 8):
    xs = {k: torch.randn(M, k) for k in (D, I)}
    ys = {t: {n: torch.empty(M, n) for n in (D, I)} for t in libs}
    T = {t: [] for t in libs}
    for i in range(8):
        for t in (list(libs) if i % 2 else list(reversed(libs))):
            s = time.perf_counter()
            for n, k, b in mats:
                if libs[t] is None: bm.matmul(8, b.ctypes.data, n, k, xs[k].data_ptr(), M, ys[t][n].data_ptr(), n, 2)
                else: bm.matmul(8, b.ctypes.data, n, k, xs[k].data_ptr(), M, ys[t][n].data_ptr(), n, 2, libs[t])
            if i: T[t].append(time.perf_counter() - s)
    same = all(torch.equal(ys["default"][n], ys[t][n]) for t in libs for n in (D, I))
    print(M, ", ".join(f"{t} {total/statistics.median(v)/1e9:.1f} GB/s" for t, v in T.items()), "same bits" if same else "DIFFERENT")
