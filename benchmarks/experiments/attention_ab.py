"""A/B two builds of native/kernels.cpp's paged decode attention, alternating in one process, medians of 9:
B sequences of ctx keys (R rows each, a verification run when R > 1), SmolLM2's heads (9 / 3, hd 64), one
cache per layer for 30 layers (so, as in the engine, the KV comes from DRAM; SHARED=1: one cache, in L3),
bf16 (FP32=1: fp32).

    .venv/bin/python benchmarks/experiments/attention_ab.py OLD.cpp NEW.cpp B ctx threads [R]
"""
import ctypes, statistics, sys, time, torch
from tokenmill.native.compile import build_library
from tokenmill.native import kernels as K
srcs = sys.argv[1:3]
B = int(sys.argv[3]); ctx = int(sys.argv[4]); threads = int(sys.argv[5]); R = int(sys.argv[6]) if len(sys.argv) > 6 else 1
fns = []
for i, src in enumerate(srcs):
    lib = ctypes.CDLL(str(build_library(f"tm_attn_ab{i}", [src], K.FLAGS)))
    f = lib.tm_paged_decode_attention
    f.argtypes = K._SIGNATURES["tm_paged_decode_attention"]
    fns.append(f)
torch.manual_seed(0)
nh, nkv, hd, bs, layers = 9, 3, 64, 16, 30
dt = torch.float32 if "FP32" in __import__("os").environ else torch.bfloat16
per = (ctx + 15) // 16
nblocks = B * per + 8
one = (torch.randn(nblocks, bs, nkv, hd).to(dt), torch.randn(nblocks, bs, nkv, hd).to(dt))
caches = [one] * layers if "SHARED" in __import__("os").environ else [(torch.randn(nblocks, bs, nkv, hd).to(dt), torch.randn(nblocks, bs, nkv, hd).to(dt)) for _ in range(layers)]
perm = torch.randperm(nblocks)
tables = torch.stack([perm[b * per:(b + 1) * per] for b in range(B)]).to(torch.int64)
# R rows per sequence (a verification run): row r of sequence b sees ctx - R + 1 + r keys
tables = tables.repeat_interleave(R, 0).contiguous()
lens = torch.tensor([ctx - R + 1 + r for b in range(B) for r in range(R)], dtype=torch.int64)
N = B * R
q = torch.randn(N, nh, hd).to(dt)
outs = [torch.empty_like(q), torch.empty_like(q)]
def step(i):
    f, out = fns[i], outs[i]
    for kc, vc in caches:
        f(0 if dt == torch.float32 else 1, out.data_ptr(), nh * hd, q.data_ptr(), nh * hd, kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), tables.stride(0),
          lens.data_ptr(), None, N, nh, nkv, hd, bs, 0.125, 0.0, K.DEFAULT_PARTITION, threads)  # 0.0: no softcap (ABI 4)
step(0); step(1)
T = [[], []]
for it in range(9):
    for i in ((0, 1) if it % 2 == 0 else (1, 0)):
        s = time.perf_counter(); step(i); T[i].append(time.perf_counter() - s)
a, b = (statistics.median(t) * 1e3 for t in T)
diff = float((outs[0].float() - outs[1].float()).abs().max())
print(f"B={B} R={R} ctx={ctx} threads={threads}: A {a:.2f} ms, B {b:.2f} ms, A/B {a/b:.2f}x; max |A-B| {diff:.2e}")
