"""The native kernels' 8-lane build (-DTM_NO_AVX512) against the default one, which takes 16-lane loops where
the compiler targets AVX-512: silu*mul and the residual add + RMSNorm over a 2048-row prefill step (same bits
either way: checked here too), and paged decode attention for 64 sequences of ~200-232 keys over 30 layers
(blocks shuffled, as a busy cache has them), bf16; best of 3 rounds, alternating. Skips the
comparison on a CPU without AVX-512 (both builds are then the 8-lane one).

    .venv/bin/python benchmarks/experiments/avx512_ab.py
"""

from __future__ import annotations

import time

import torch

from tokenmill.cpu_features import cpu_flags
from tokenmill.native import kernels

if "avx512f" not in cpu_flags():
    raise SystemExit("no AVX-512 on this CPU: nothing to compare")
LIBS = {"8 lanes": kernels.library(kernels.FLAGS + ("-DTM_NO_AVX512",)), "16 lanes": kernels.library(kernels.FLAGS)}
CODE = {torch.float32: 0, torch.bfloat16: 1}
THREADS = torch.get_num_threads()
torch.manual_seed(0)


def best(fn, rounds: int = 3, reps: int = 5) -> float:
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        out = min(out, (time.perf_counter() - t) / reps)
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


for dt in (torch.bfloat16, torch.float32):
    T, I, D = 2048, 1536, 576
    x = (torch.randn(T, 2 * I) * 4).to(dt)
    xs, r0, w = torch.randn(T, D).to(dt), torch.randn(T, D).to(dt), torch.randn(D).to(dt)
    times, outs = {}, {}
    for name, lib in LIBS.items():
        out, nout, res = torch.empty(T, I, dtype=dt), torch.empty(T, D, dtype=dt), r0.clone()
        times[name] = (best(lambda: lib.tm_silu_and_mul(CODE[dt], out.data_ptr(), I, x.data_ptr(), 2 * I, T, I,
                                                        THREADS)),
                       best(lambda: lib.tm_add_rms_norm(CODE[dt], nout.data_ptr(), D, xs.data_ptr(), D,
                                                        res.data_ptr(), D, w.data_ptr(), T, D, 1e-5, THREADS)))
        res = r0.clone()
        lib.tm_add_rms_norm(CODE[dt], nout.data_ptr(), D, xs.data_ptr(), D, res.data_ptr(), D, w.data_ptr(), T, D,
                            1e-5, THREADS)
        outs[name] = (out, nout, res)
    same = all(torch.equal(bits(a), bits(b)) for a, b in zip(*outs.values()))
    (s8, n8), (s16, n16) = times.values()
    print(f"{dt}: silu*mul {T}x{I} {s8 * 1e3:.3f} / {s16 * 1e3:.3f} ms ({s8 / s16:.2f}x), add+rmsnorm {T}x{D} "
          f"{n8 * 1e3:.3f} / {n16 * 1e3:.3f} ms ({n8 / n16:.2f}x), same bits: {same}")

B, bs, L = 64, 16, 30
for dt in (torch.bfloat16,):  # fp32 keys take the 8-lane tiles in both builds (16 measured 0.95x at hd 64)
    for nh, nkv, hd in ((9, 3, 64), (32, 8, 128)):
        layers = L if hd == 64 else 4  # the 128-wide heads' caches are big: 4 layers, scaled to 30
        ctx = 232
        nblk = -(-ctx // bs)
        caches = [(torch.randn(B * nblk + 1, bs, nkv, hd).to(dt), torch.randn(B * nblk + 1, bs, nkv, hd).to(dt))
                  for _ in range(layers)]
        tables = torch.randperm(B * nblk).view(B, nblk).contiguous()
        lens = torch.randint(ctx - 32, ctx + 1, (B,), dtype=torch.int64)
        q = torch.randn(B, nh, hd).to(dt)
        times, outs = {}, {}
        for name, lib in LIBS.items():
            out = torch.empty_like(q)

            def run(lib=lib, out=out) -> None:
                for k, v in caches:
                    assert lib.tm_paged_decode_attention(CODE[dt], out.data_ptr(), out.stride(0), q.data_ptr(),
                                                         q.stride(0), k.data_ptr(), v.data_ptr(), tables.data_ptr(),
                                                         tables.stride(0), lens.data_ptr(), None, B, nh, nkv, hd, bs,
                                                         hd ** -0.5, 0.0, kernels.DEFAULT_PARTITION, THREADS) == 0

            times[name] = best(run, reps=2) * L / layers
            outs[name] = out.float()
        diff = float((outs["8 lanes"] - outs["16 lanes"]).abs().max())
        a, b = times.values()
        print(f"{dt} decode attention {B} x ~{ctx} keys, {nh} / {nkv} heads of {hd}, {L} layers: {a * 1e3:.1f} / "
              f"{b * 1e3:.1f} ms ({a / b:.2f}x), max |diff| {diff:.1e}")
