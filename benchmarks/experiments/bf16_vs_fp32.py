"""F.linear at fp32 against bf16 (plain and oneDNN-prepacked) on the default model's layer shapes, 1-512 rows, 2 threads:
whether this CPU multiplies bf16 natively (benchmarks/README.md, "bf16 on AVX512_BF16").

    .venv/bin/python benchmarks/experiments/bf16_vs_fp32.py
"""
import torch, time, torch.nn.functional as F
from tokenmill.platforms.onednn import can_prepack, prepack, packed_linear
torch.set_num_threads(2)
print("can_prepack", can_prepack())
for (n,k) in [(576,576),(3072,576),(576,1536),(49152,576)]:
    w = torch.randn(n,k)
    wb = w.bfloat16(); pk = prepack(wb) if can_prepack() else None
    for m in [1,4,16,64,256,512]:
        x = torch.randn(m,k); xb = x.bfloat16()
        def t(fn, reps=20):
            fn(); best=1e9
            for _ in range(3):
                t0=time.perf_counter()
                for _ in range(reps): fn()
                best=min(best,(time.perf_counter()-t0)/reps)
            return best
        a=t(lambda: F.linear(x,w)); b=t(lambda: F.linear(xb,wb)); c=t(lambda: packed_linear(xb,pk)) if pk is not None else float('nan')
        print(f"{n}x{k} M={m}: fp32 {a*1e3:.3f} ms  bf16 {b*1e3:.3f}  bf16 packed {c*1e3:.3f}  ratio fp32/packed {a/c:.2f}")
