"""native/amx_matmul.cpp, plain Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K blocks on Intel AMX at bf16: against the
reference it claims (x rounded to bf16 times the blocks dequantized by gguf-py and rounded to bf16, in fp64: only the
fp32 accumulation differs), row by row independent of the batch, the 16-row tiling and the thread count;
refused where it cannot run. Skips on CPUs without AMX-BF16 (the AVX2 kind)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenmill.native import block_matmul, ggml

sys.path.insert(0, str(Path(__file__).parent))
from gguf_blocks import multiply, quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not (ggml.available() and block_matmul.amx_available()),
                                reason="needs ggml (the quantizer) and a CPU with AMX-BF16 and AVX512-BF16")
TYPES = ["Q4_0", "Q4_1", "Q8_0"]


def run(qtype: int, blocks: np.ndarray, x: torch.Tensor, threads: int = 1) -> torch.Tensor:
    return multiply(qtype, blocks, x, threads, amx=True)


# the K-quants (256-value super-blocks, 8 runs of 32 with their own scales) from a multiple of 256 columns
CASES = ([(t, n, k) for t in TYPES for n, k in [(16, 32), (48, 576), (96, 1536)]]
         + [(t, n, k) for t in ("Q4_K", "Q5_K", "Q6_K") for n, k in [(16, 256), (48, 512), (96, 1536)]])


@pytest.mark.parametrize("type_name, n, k", CASES)
def test_against_the_bf16_reference_and_row_independent(type_name: str, n: int, k: int) -> None:
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(70, k, generator=g)  # 70 rows: a full 64-row pass of 4 tiles, then 6 rows
    x[3] = 0.0
    x[4] *= 100.0
    y = run(qtype, blocks, x, threads=2)
    ref = F.linear(x.to(torch.bfloat16).double(), w.float().to(torch.bfloat16).double())
    assert torch.equal(y[3], torch.zeros(n))
    for i in range(x.shape[0]):
        if i == 3:
            continue
        err = float((y[i].double() - ref[i]).norm() / ref[i].norm())
        assert err < 1e-5, f"{type_name} row {i}: relative error {err:.2e} against bf16 x . bf16 W in fp64"
    # every batch size (1 to 4 tiles of 16, and past 64), every row offset, one thread or two: the same bits
    for m in (1, 2, 15, 16, 17, 33, 64, 65):
        for start in {0, x.shape[0] - m}:
            for threads in (1, 2):
                part = run(qtype, blocks, x[start:start + m], threads)
                assert torch.equal(part, y[start:start + m]), (type_name, m, start, threads)


def test_refuses_what_it_cannot_take() -> None:
    qtype, blocks, _ = quantized("Q4_1", 40, 32, seed=0)  # 40 rows: not a multiple of 16
    assert not block_matmul.amx_supports(40) and block_matmul.amx_supports(48)
    x = torch.randn(2, 32)
    with pytest.raises(RuntimeError, match="status -2"):
        run(qtype, blocks, x)
    from gguf import GGMLQuantizationType

    q5, blocks5, _ = quantized("Q5_0", 48, 32, seed=0)  # a type the kernel does not take
    assert q5 == int(GGMLQuantizationType.Q5_0)
    with pytest.raises(RuntimeError, match="status -1"):
        run(q5, blocks5, x)


@pytest.mark.parametrize("type_name", TYPES)
def test_grouped_equals_one_call_per_group(type_name: str) -> None:
    """A mixture of experts' call: each group as the method would multiply it alone (AMX from
    AMX_MIN_ROWS rows, the integer block kernel below)."""
    k, n = 64, 32
    mats = [quantized(type_name, n, k, seed=s) for s in range(4)]
    counts = [5, 0, 20, block_matmul.AMX_MIN_ROWS - 1]  # the last group under the AMX kernel's rows
    x = torch.randn(sum(counts), k)
    y = torch.full((sum(counts), n), float("nan"))
    block_matmul.matmul_grouped(mats[0][0], [m[1].ctypes.data for m in mats], counts, n, k, x.data_ptr(),
                                y.data_ptr(), 2, amx=True)
    r0 = 0
    for (qtype, blocks, _), c in zip(mats, counts):
        if c >= block_matmul.AMX_MIN_ROWS:
            assert torch.equal(y[r0:r0 + c], run(qtype, blocks, x[r0:r0 + c]))
        elif c:  # what the method gives such a group alone: the integer block kernel
            alone = torch.empty(c, n)
            block_matmul.matmul(qtype, blocks.ctypes.data, n, k, x[r0:r0 + c].contiguous().data_ptr(), c,
                                alone.data_ptr(), n, 1)
            assert torch.equal(y[r0:r0 + c], alone)
        r0 += c


@pytest.mark.parametrize("type_name, n, k", [("Q4_1", 48, 576), ("Q8_0", 96, 1536), ("Q4_K", 48, 512)])
def test_bf16_rows_in_and_out_give_the_bits_of_the_fp32_entry_rounded(type_name: str, n: int, k: int) -> None:
    """tm_amx_matmul_bf16 (the native decode step's call at bf16): x as bf16 rows, y rounded to bf16 in the
    kernel, equal bit for bit to tm_amx_matmul on x widened with its fp32 result rounded by torch (ties to
    even), rows written ldy apart into a wider output (the fused projections' column parts); NaN where
    it gives NaN."""
    qtype, blocks, _ = quantized(type_name, n, k, seed=k)
    lib = block_matmul.library()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(70, k, generator=g).to(torch.bfloat16)
    x[1, :5] = 1e-40  # denormal inputs: the tile multiply takes them as zero on both paths
    x[2, 7] = float("nan")  # a NaN row stays NaN
    x[5] *= 1e30  # outputs near fp32's top
    for m in (1, 16, 64, 70):
        wide = torch.empty(m, n)
        xs = x[:m].float().contiguous()
        assert lib.tm_amx_matmul(qtype, blocks.ctypes.data, n, k, xs.data_ptr(), k, m, wide.data_ptr(), n, 2) == 0
        out = torch.full((m, n + 32), 7.0, dtype=torch.bfloat16)  # columns [16, 16 + n) written, the rest kept
        xb = x[:m].contiguous()
        assert lib.tm_amx_matmul_bf16(qtype, blocks.ctypes.data, n, k, xb.data_ptr(), k, m,
                                      out[:, 16:].data_ptr(), n + 32, 2) == 0
        ref, got = wide.to(torch.bfloat16), out[:, 16:16 + n]
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan)
        assert bool(nan[2].all()) if m > 2 else not bool(nan.any())
        # bits equal off the NaNs (a NaN's payload is the tile unit's: its input was made quiet differently)
        assert torch.equal(got.view(torch.int16)[~nan], ref.view(torch.int16)[~nan]), (type_name, m)
        assert bool((out[:, :16] == 7.0).all()) and bool((out[:, 16 + n:] == 7.0).all())
