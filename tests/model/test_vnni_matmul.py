"""native/vnni_matmul.cpp, the 8-bit panel kernel on AVX512-VNNI for plain Q4_0 / Q4_1 / Q8_0 blocks (the gguf
method's panel kernel at bf16 on CPUs with VNNI and no AMX). Its arithmetic is llama.cpp's: x quantized to
int8 per 32-block (d = max|x| / 127, q = round-half-even(x * 127 / max|x|)), integer products with the
weights' quants, the blocks' scales applied in fp32. So it is checked two ways: against that arithmetic done
in fp64 on gguf-py's dequantized weights (within fp32 rounding: a wrong layout, lane or scale is far off),
and against the unrounded fp64 product (the one-matmul bound of the gguf method's tests, 2e-2). Each row's
result is the same bits alone or in any batch, at any thread count. Skipped where the kernel is not built
(a CPU without AVX512-VNNI: the entry then hands the call to the fp32 panel kernel).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_blocks import multiply, quantized

from tokenmill.native import block_matmul

pytestmark = pytest.mark.skipif(not block_matmul.vnni_built(), reason="the VNNI kernel runs on AVX512-VNNI")


def int8_x(x: torch.Tensor) -> torch.Tensor:
    """x (m, k) as the kernel rounds it: per 32-block q * d, in fp64 (the fp32 steps as the kernel takes them)."""
    xb = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    d = (amax / np.float32(127.0)).astype(np.float32)
    return torch.from_numpy((q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape))


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n,k", [(37, 96), (64, 576), (48, 1536)])
def test_against_its_arithmetic_and_the_unrounded_product(type_name: str, n: int, k: int) -> None:
    """n = 37: a partial last panel; 300 rows: past the kernel's 256-row chunk, with tiles of 8 and a tail."""
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(300, k, generator=g)
    x[1] = 0.0  # a zero row (scale 0)
    x[2, :32] *= 40.0  # an outlier block
    y = multiply(qtype, blocks, x, threads=2, vnni=True).double()
    emulated = int8_x(x) @ w.T
    ref = x.double() @ w.T
    scale = ref.norm(dim=1).clamp_min(1e-30)
    assert torch.equal(y[1], torch.zeros(n, dtype=torch.float64)) and torch.equal(y[:, 0], torch.zeros(300).double())
    err = float(((y - emulated).norm(dim=1) / scale).max())
    assert err < 1e-5, f"{type_name}: {err:.2e} from the kernel's own arithmetic"
    rel = (y - ref).norm(dim=1) / scale
    rel[1] = 0.0
    assert float(rel.max()) < 2e-2 and float(rel.median()) < 1e-2, f"{type_name}: {float(rel.max()):.2e} unrounded"


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_a_row_gives_the_same_bits_alone_or_batched(type_name: str) -> None:
    qtype, blocks, _ = quantized(type_name, 70, 256, seed=5)
    x = torch.randn(23, 256, generator=torch.Generator().manual_seed(6))
    whole = multiply(qtype, blocks, x, threads=2, vnni=True)
    for start, m in ((0, 1), (5, 3), (7, 9), (22, 1)):
        part = multiply(qtype, blocks, x[start : start + m], threads=1 + m % 3, vnni=True)
        assert torch.equal(part, whole[start : start + m])


def test_honours_the_row_stride_of_x_and_hands_other_types_on() -> None:
    lib = block_matmul.library()
    qtype, blocks, _ = quantized("Q4_1", 20, 64, seed=1)
    wide = torch.randn(7, 100)
    y = torch.empty(7, 20)
    assert lib.tm_vnni_matmul(qtype, blocks.ctypes.data, 20, 64, wide.data_ptr(), 100, 7, y.data_ptr(), 20, 2) == 0
    assert torch.equal(y, multiply(qtype, blocks, wide[:, :64], vnni=True))
    # a K-quant: the block kernel's result, as the fp32 panel entry gives it
    kq, kblocks, _ = quantized("Q4_K", 16, 256, seed=2)
    x = torch.randn(12, 256)
    assert torch.equal(multiply(kq, kblocks, x, vnni=True), multiply(kq, kblocks, x))


def test_the_method_takes_it_at_bf16_only_and_drops_the_dense_copy(monkeypatch) -> None:
    """Asked for (TOKENMILL_VNNI_MATMUL=1), on this CPU (VNNI; no AMX, or the test is skipped) at bf16 the
    default model keeps no dense copy (the
    panel takes every Q4_1 / Q8_0 matrix), the method's panel and the native step's are the VNNI kernel, and
    teacher-forced logits stay near the fp32 dequantized reference (measured: top-1 0.958 against the dense
    bf16 copy's 0.975 on 2,000 tokens; benchmarks/experiments/vnni_agreement.py); at fp32 the fp32 panel."""
    if block_matmul.amx_available():
        pytest.skip("on AMX the AMX kernel takes bf16 batches")
    from raw_forward import prompt_logits
    from test_gguf_method import corpus_ids

    from tokenmill import LLM
    from tokenmill.native import decode_step

    monkeypatch.setenv("TOKENMILL_PANEL_MIN_ROWS", "1")
    monkeypatch.setenv("TOKENMILL_GGML_MAX_ROWS", str(10**6))
    assert not block_matmul.vnni_available()  # opt-in
    monkeypatch.setenv("TOKENMILL_VNNI_MATMUL", "1")
    ours = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="bfloat16")
    assert not ours.engine.platform.compute.dense_copy
    method = ours.engine.executor.worker.model.lm_head.method
    assert method.vnni_panel(torch.bfloat16) and not method.vnni_panel(torch.float32)
    table = decode_step.kernel_table(1, method.vnni_panel(torch.bfloat16))
    lib = block_matmul.library()
    import ctypes
    assert table.panel_matmul == ctypes.cast(lib.tm_vnni_matmul, ctypes.c_void_p).value
    ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32",
              quantization="dequantize")
    agree = total = 0
    for ids in corpus_ids(ref.tokenizer, 1000):
        a, b = prompt_logits(ref, ids), prompt_logits(ours, ids).float()
        rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
        assert float(rel.median()) < 3e-2
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(ids)
    assert agree / total >= 0.93, f"teacher-forced top-1 agreement {agree / total:.3f}"
