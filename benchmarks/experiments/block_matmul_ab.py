"""A/B two builds of native/block_matmul.cpp in one process over the default model's 120 block matrices, alternating, medians of 15; 2 threads.

    .venv/bin/python benchmarks/experiments/block_matmul_ab.py OLD.cpp NEW.cpp [threads]
"""
import ctypes, statistics, sys, time, gc, torch
from tokenmill.native.compile import build_library
from tokenmill.native import block_matmul as bm
from tokenmill.entrypoints.llm import LLM
from tokenmill.worker.model_runner import ModelRunner
A = sys.argv[1]; B = sys.argv[2]
libs = {}
for tag, src in (("A", A), ("B", B)):
    # since 2026-12-06 block_matmul.cpp hands the K-quants to kquant_matmul.cpp (and that uses its quantizer)
    # (kquant_matmul.cpp beside it where there is one: the two share the activation quantizer's signature)
    kq = __import__("pathlib").Path(src).with_name("kquant_matmul.cpp")
    kq = kq if kq.exists() else bm.KQUANT_SOURCE
    path = build_library("tm_ab_" + tag, [src] + ([kq] if "tm_kquant" in open(src).read() else []), bm.FLAGS)
    lib = ctypes.CDLL(str(path))
    f = lib.tm_block_matmul
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    libs[tag] = f
llm = LLM(model="default", progress=False)
runner = next(o for o in gc.get_objects() if isinstance(o, ModelRunner))
m = runner.model
lins = [l for layer in m.model.layers for l in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
def run(f, M, xs, ys):
    for l in lins:
        for (t, ptr, rows, off) in l.block_mm:
            f(t, ptr, rows, l.in_features, xs[l.in_features].data_ptr(), l.in_features, M, ys[l.out_features].data_ptr() + 4 * off, l.out_features, threads)
for M in tuple(int(v) for v in __import__("os").environ.get("ROWS", "1,2,3,4,5,6,8").split(",")):
    xs = {l.in_features: torch.randn(M, l.in_features) for l in lins}
    ya = {l.out_features: torch.empty(M, l.out_features) for l in lins}
    yb = {l.out_features: torch.empty(M, l.out_features) for l in lins}
    run(libs["A"], M, xs, ya); run(libs["B"], M, xs, yb)
    same = all(torch.equal(ya[k], yb[k]) for k in ya)
    T = {"A": [], "B": []}
    for i in range(15):
        for tag in (("A", "B") if i % 2 == 0 else ("B", "A")):
            s = time.perf_counter(); run(libs[tag], M, xs, ya if tag == "A" else yb); T[tag].append(time.perf_counter() - s)
    a, b = statistics.median(T["A"]) * 1e3, statistics.median(T["B"]) * 1e3
    print(f"M={M}: A {a:.2f} ms, B {b:.2f} ms, A/B {a/b:.2f}x, identical {same}")
