"""native/block_matmul.cpp, the multi-row kernel for plain Q4_0 / Q4_1 / Q8_0 blocks: against the
dequantized fp64 reference (gguf-py's dequantizer; x is quantized to 16 bits, so within 1e-4), row by row independent of the batch, the row pairing
and the thread count; the plain C++ build (-DTM_PORTABLE) agrees with the AVX2 one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenmill.native import block_matmul, ggml

sys.path.insert(0, str(Path(__file__).parent))
from gguf_blocks import quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not (ggml.available() and block_matmul.available()),
                                reason="needs ggml (the quantizer) and the block matmul kernel")
TYPES = ["Q4_0", "Q4_1", "Q8_0"]


def run(qtype: int, blocks: np.ndarray, x: torch.Tensor, threads: int = 1, lib=None) -> torch.Tensor:
    n, (m, k) = blocks.shape[0], x.shape
    y = torch.full((m, n + 3), float("nan"))  # rows ldy = n + 3 apart: the kernel writes only its n columns
    block_matmul.matmul(qtype, blocks.ctypes.data, n, k, x.contiguous().data_ptr(), m, y.data_ptr(), n + 3, threads,
                        lib)
    assert torch.isnan(y[:, n:]).all()
    return y[:, :n]


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n, k", [(40, 32), (96, 576), (33, 1536)])
def test_against_the_dequantized_reference_and_row_independent(type_name: str, n: int, k: int) -> None:
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(19, k, generator=g)
    x[3] = 0.0  # an all-zero activation row
    x[4] *= 100.0  # and a large one
    y = run(qtype, blocks, x)
    ref = F.linear(x.double(), w)
    for i in range(x.shape[0]):
        if i == 3:
            assert torch.equal(y[i], torch.zeros(n))
            continue
        err = float((y[i].double() - ref[i]).norm() / ref[i].norm())
        # 16-bit activations: x's rounding only, ~1e-5 (8-bit ones, ggml's, give ~5e-3)
        assert err < 1e-4, f"{type_name} row {i}: relative error {err:.2e}"
    # every batch size, every row offset in it, and the thread count: the same bits
    for m in (1, 2, 3, 7, 8, 9, 16, 19):
        for start in {0, x.shape[0] - m}:
            part = run(qtype, blocks, x[start : start + m], threads=1 + m % 3)
            assert torch.equal(part, y[start : start + m]), f"{type_name}: rows depend on the batch (m={m})"


@pytest.mark.parametrize("type_name", TYPES)
def test_the_portable_build_agrees(type_name: str) -> None:
    portable = block_matmul.library(block_matmul.FLAGS + ("-DTM_PORTABLE",))
    assert portable is not None
    qtype, blocks, w = quantized(type_name, 48, 576, seed=7)
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(2))
    a, b = run(qtype, blocks, x), run(qtype, blocks, x, lib=portable)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    assert torch.equal(run(qtype, blocks, x[2:3], lib=portable), b[2:3])  # row independent there too


def test_unsupported_types_and_shapes_are_refused() -> None:
    lib = block_matmul.library()
    assert lib is not None
    assert not block_matmul.supports(12)  # Q4_K: ggml's kernels
    assert lib.tm_block_matmul(12, None, 1, 32, None, 32, 1, None, 1, 1) == -1
    assert lib.tm_block_matmul(2, None, 1, 48, None, 48, 1, None, 1, 1) == -2  # K not a multiple of 32


@pytest.mark.parametrize("type_name", TYPES)
def test_grouped_equals_one_call_per_group(type_name: str) -> None:
    """A mixture of experts' layer in one call: each group's rows are exactly the single call's, empty
    groups included, whatever the thread count."""
    mats = [quantized(type_name, 40, 64, seed=s) for s in range(4)]
    counts = [3, 0, 9, 1]
    x = torch.randn(sum(counts), 64, generator=torch.Generator().manual_seed(3))
    for threads in (1, 2):
        y = torch.empty(sum(counts), 40)
        block_matmul.matmul_grouped(mats[0][0], [m[1].ctypes.data for m in mats], counts, 40, 64,
                                    x.data_ptr(), y.data_ptr(), threads)
        r0 = 0
        for (qtype, blocks, _), c in zip(mats, counts):
            if c:
                assert torch.equal(y[r0 : r0 + c], run(qtype, blocks, x[r0 : r0 + c]))
            r0 += c
