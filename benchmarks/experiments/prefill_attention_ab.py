"""Prefill attention, the torch path (SDPA per chunk, tokenmill/attention/paged.py) against the native
decode kernel taking the chunk's rows as queries at successive positions (runs of up to 16 rows read each
tile once), and with the rows marked as prompt rows (prefill_from=0: at bf16 on AVX-512 the lane-wise
tiles, kernels.cpp attend_range_lanes): the default model's shapes (9 query heads, 3 KV heads, head dim 64), 30 layers a call,
alternating, median of R rounds. Chunks given as prefix:length pairs (prefix: positions already cached).

    .venv/bin/python benchmarks/experiments/prefill_attention_ab.py [dtype] [prefix:len ...]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from tokenmill.attention.backend import PrefillChunk
from tokenmill.attention.paged import prefill_attention
from tokenmill.native import kernels

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1] if len(sys.argv) > 1 else "fp32"]
specs = [tuple(int(x) for x in a.split(":")) for a in sys.argv[2:]] or [(0, 200), (0, 512), (88, 112), (300, 212)]
L, nh, nkv, hd, bs, R = 30, 9, 3, 64, 16, 7
scale = hd ** -0.5
torch.manual_seed(0)
for prefix, n in specs:
    ctx = prefix + n
    nb = -(-ctx // bs)
    # each layer its own cache region (as in the engine: the layers' caches are separate), blocks shuffled
    num_blocks = nb * 4
    caches = [(torch.randn(num_blocks, bs, nkv, hd).to(dtype), torch.randn(num_blocks, bs, nkv, hd).to(dtype))
              for _ in range(L)]
    table = torch.randperm(num_blocks)[:nb].to(torch.long)
    q = [torch.randn(n, nh, hd).to(dtype) for _ in range(L)]
    k = [torch.randn(n, nkv, hd).to(dtype) for _ in range(L)]
    v = [torch.randn(n, nkv, hd).to(dtype) for _ in range(L)]
    # the chunk's own K/V in the cache, as write_kv leaves them before attention
    pos = torch.arange(prefix, ctx)
    slots = table[pos // bs] * bs + pos % bs
    for (kc, vc), kk, vv in zip(caches, k, v):
        kc.view(-1, nkv, hd)[slots] = kk
        vc.view(-1, nkv, hd)[slots] = vv
    chunk = PrefillChunk(0, n, prefix, table)

    def torch_path() -> list[torch.Tensor]:
        outs = []
        for i in range(L):
            o = torch.empty_like(q[i])
            prefill_attention(o, q[i], k[i], v[i], caches[i][0], caches[i][1], [chunk], scale)
            outs.append(o)
        return outs

    tables = table[None].expand(n, nb)  # one table for every row (row stride 0)
    lens = torch.arange(prefix + 1, ctx + 1, dtype=torch.long)

    def native_path(prefill: bool = False) -> list[torch.Tensor]:
        outs = []
        for i in range(L):
            o = torch.empty_like(q[i])
            assert kernels.paged_decode_attention(o, q[i], caches[i][0], caches[i][1], tables, lens, scale,
                                                  prefill_from=0 if prefill else None)
            outs.append(o)
        return outs

    a, b, c = torch_path(), native_path(), native_path(True)
    err = max(((x.float() - y.float()).abs().max() / x.float().abs().max()).item() for x, y in zip(a, b))
    err_c = max(((x.float() - y.float()).abs().max() / x.float().abs().max()).item() for x, y in zip(a, c))
    ta, tb, tc = [], [], []
    for _ in range(R):
        s = time.perf_counter(); torch_path(); ta.append(time.perf_counter() - s)
        s = time.perf_counter(); native_path(); tb.append(time.perf_counter() - s)
        s = time.perf_counter(); native_path(True); tc.append(time.perf_counter() - s)
    A, B, C = (statistics.median(t) * 1e3 for t in (ta, tb, tc))
    flops = 4 * L * nh * hd * sum(prefix + i + 1 for i in range(n))
    print(f"{dtype} prefix {prefix} chunk {n}, {L} layers, {torch.get_num_threads()} threads: torch {A:.2f} ms, "
          f"native {B:.2f} ms ({flops / B / 1e6:.0f} GFLOPS), as prompt rows {C:.2f} ms ({flops / C / 1e6:.0f} "
          f"GFLOPS); torch/native {A / B:.2f}x, native/prompt rows {B / C:.2f}x; max rel diff {err:.1e} / {err_c:.1e}")
