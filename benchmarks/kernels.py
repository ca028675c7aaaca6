"""Native CPU decode kernels (tokenmill/native/kernels.cpp) against the torch path they replace.

    PYTHONPATH=. .venv/bin/python benchmarks/kernels.py [--only norm,silu,rotary,attention] [--repeat 30]
                                                        [--threads 1,2] [--dtype float32]

Each case times the torch form and the native kernel paired (one call of each per round, the minimum of
each over the rounds), at one thread and at two. Ratios are torch time / native time (> 1: the kernel is
faster). Inputs rotate through enough copies to exceed the L3, so every call reads its data cold, as a
model's layers do. Decode attention compares the kernel reading the paged cache with
  - mirror: the decode_mirror backend's SDPA over contiguous per-request rows (the CPU default before), and
  - paged:  the paged backend's gather of every block, then SDPA;
each for one layer, with the same contexts (random in [256, 512]) and the inputs already in place (the
mirror's per-step row upkeep and both backends' K/V writes are not counted).
Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tokenmill.attention.paged import gather_blocks
from tokenmill.layers.rotary import RotaryEmbedding, inv_frequencies, rotate
from tokenmill.native import kernels as K

COLD_BYTES = 96 * 2**20  # > the L3 of the machines we measure on


def cpu_line() -> str:
    model = "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    except (OSError, subprocess.SubprocessError):
        pass
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "amx_bf16"))
    return f"CPU: {model}; {have}; {torch.get_num_threads()} threads available; torch {torch.__version__}"


def copies(nbytes: int) -> int:
    return max(1, min(64, -(-COLD_BYTES // max(nbytes, 1))))


def paired(a: Callable[[int], object], b: Callable[[int], object], n_copies: int, repeat: int) -> tuple[float, float]:
    """min seconds of a(i) and b(i), called alternately; i cycles through the input copies."""
    ta, tb = float("inf"), float("inf")
    for i in range(3):  # warm up (and build)
        a(i % n_copies)
        b(i % n_copies)
    for r in range(repeat):
        for fn, is_a in ((a, True), (b, False)) if r % 2 == 0 else ((b, False), (a, True)):
            t0 = time.perf_counter()
            fn(r % n_copies)
            dt = time.perf_counter() - t0
            if is_a:
                ta = min(ta, dt)
            else:
                tb = min(tb, dt)
    return ta, tb


def row(name: str, shape: str, threads: int, t_torch: float, t_native: float, extra: str = "") -> None:
    print(f"| {name} | {shape} | {threads} | {t_torch * 1e6:9.1f} | {t_native * 1e6:9.1f} | "
          f"{t_torch / t_native:5.2f}x |{extra}")


def bench_norm(dtype: torch.dtype, repeat: int, threads: int) -> None:
    for D in (576, 4096):
        for T in (1, 16, 64):
            n = copies(3 * T * D * 4)
            xs = [torch.randn(T, D, dtype=dtype) for _ in range(n)]
            rs = [torch.randn(T, D, dtype=dtype) for _ in range(n)]
            w = torch.randn(D, dtype=dtype)

            def eager(i: int) -> object:
                r = rs[i] + xs[i]
                return F.rms_norm(r, (D,), w, 1e-5), r

            def native(i: int) -> object:
                return K.add_rms_norm(xs[i], rs[i], w, 1e-5)

            row("residual add + RMSNorm", f"T={T} D={D}", threads, *paired(eager, native, n, repeat))


def bench_silu(dtype: torch.dtype, repeat: int, threads: int) -> None:
    for inter in (1536, 14336):
        for T in (1, 16, 64):
            n = copies(3 * T * inter * 4)
            xs = [torch.randn(T, 2 * inter, dtype=dtype) for _ in range(n)]

            def eager(i: int) -> object:
                gate, up = xs[i].chunk(2, dim=-1)
                return F.silu(gate) * up

            row("silu(gate) * up", f"T={T} I={inter}", threads,
                *paired(eager, lambda i: K.silu_and_mul(xs[i]), n, repeat))


def bench_rotary(dtype: torch.dtype, repeat: int, threads: int) -> None:
    for nh, nkv, hd in ((9, 3, 64), (32, 8, 128)):
        rope = RotaryEmbedding(hd, 4096, inv_frequencies(hd, 10000.0, None), torch.device("cpu"), dtype)
        for T in (1, 16, 64):
            n = copies(T * (nh + 2 * nkv) * hd * 4)
            qkvs = [torch.randn(T, (nh + 2 * nkv) * hd, dtype=dtype) for _ in range(n)]
            tables = rope.tables(torch.randint(0, 4096, (T,)))

            def qk(i: int) -> torch.Tensor:
                return qkvs[i][:, : (nh + nkv) * hd].view(T, nh + nkv, hd)

            def native(i: int) -> object:
                return K.rotary_(qk(i), tables.cos, tables.signed_sin)

            row("rotary (q and k heads)", f"T={T} {nh}+{nkv}x{hd}", threads,
                *paired(lambda i: rotate(qk(i), tables), native, n, repeat))


def bench_attention(dtype: torch.dtype, repeat: int, threads: int, partition: int) -> None:
    bs = 16
    for nh, nkv, hd in ((9, 3, 64), (28, 4, 128), (32, 8, 128)):
        for B in (1, 16, 64):
            gen = torch.Generator().manual_seed(B)
            lens = torch.randint(256, 513, (B,), generator=gen)
            max_blocks = -(-int(lens.max()) // bs)
            nb = B * max_blocks
            layer_bytes = 2 * nb * bs * nkv * hd * 4
            n = copies(2 * layer_bytes)  # the paged cache and the mirror's rows
            perm = torch.randperm(nb, generator=gen)
            tables = perm.view(B, max_blocks).contiguous()  # scattered blocks, as in a long-running server
            caches = [(torch.randn(nb, bs, nkv, hd, dtype=dtype), torch.randn(nb, bs, nkv, hd, dtype=dtype))
                      for _ in range(n)]
            # the mirror's rows: (B, nkv, cap, hd) with cap a power of two >= the longest context
            cap = max(128, 1 << (int(lens.max()) - 1).bit_length())
            rows = []
            for kc, vc in caches:
                kr = torch.zeros(B, nkv, cap, hd, dtype=dtype)
                vr = torch.zeros(B, nkv, cap, hd, dtype=dtype)
                for b in range(B):
                    L = int(lens[b])
                    kr[b, :, :L] = gather_blocks(kc, tables[b]).view(-1, nkv, hd)[:L].transpose(0, 1)
                    vr[b, :, :L] = gather_blocks(vc, tables[b]).view(-1, nkv, hd)[:L].transpose(0, 1)
                rows.append((kr, vr))
            qs = [torch.randn(B, nh, hd, dtype=dtype) for _ in range(n)]
            out = torch.empty(B, nh, hd, dtype=dtype)
            scale = hd ** -0.5
            max_len = int(lens.max())
            mirror_mask = (torch.arange(max_len)[None, :] < lens[:, None])[:, None, None, :]
            paged_mask = (torch.arange(max_blocks * bs)[None, :] < lens[:, None])[:, None, None, :]

            def mirror(i: int) -> object:
                kr, vr = rows[i]
                return F.scaled_dot_product_attention(qs[i].unsqueeze(2), kr[:, :, :max_len], vr[:, :, :max_len],
                                                      attn_mask=mirror_mask, scale=scale, enable_gqa=True)

            def paged(i: int) -> object:
                kc, vc = caches[i]
                kd = gather_blocks(kc, tables).view(B, -1, nkv, hd).transpose(1, 2)
                vd = gather_blocks(vc, tables).view(B, -1, nkv, hd).transpose(1, 2)
                return F.scaled_dot_product_attention(qs[i].unsqueeze(2), kd, vd, attn_mask=paged_mask, scale=scale,
                                                      enable_gqa=True)

            def native(i: int) -> object:
                kc, vc = caches[i]
                return K.paged_decode_attention(out, qs[i], kc, vc, tables, lens, scale, partition)

            shape = f"B={B} {nh}/{nkv}x{hd}"
            t_mirror, t_native = paired(mirror, native, n, repeat)
            t_paged, t_native2 = paired(paged, native, n, repeat)
            row("decode attention vs mirror SDPA", shape, threads, t_mirror, t_native)
            row("decode attention vs paged gather+SDPA", shape, threads, t_paged, t_native2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="norm,silu,rotary,attention")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--partition", type=int, default=K.DEFAULT_PARTITION, help="decode attention's KV partition")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    if K.library() is None:
        raise SystemExit("the native kernels did not build (see the log)")
    print(cpu_line())
    print(f"dtype {args.dtype}, min of {args.repeat} paired rounds; ratio = torch / native (> 1: native faster)\n")
    print("| kernel | shape | threads | torch us | native us | ratio |")
    print("|---|---|---|---|---|---|")
    only = set(args.only.split(","))
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        if "norm" in only:
            bench_norm(dtype, args.repeat, threads)
        if "silu" in only:
            bench_silu(dtype, args.repeat, threads)
        if "rotary" in only:
            bench_rotary(dtype, args.repeat, threads)
        if "attention" in only:
            bench_attention(dtype, max(5, args.repeat // 3), threads, args.partition)


if __name__ == "__main__":
    main()
