"""native/panel_matmul.cpp, the fp32 panel kernel for plain Q4_0 / Q4_1 / Q8_0 blocks at batches of rows:
against the dequantized fp64 reference (x is taken at fp32, so within fp32 rounding), row by row the same bits
whatever the batch, the row's place in it, a partial panel and the thread count; the plain C++ build
(-DTM_PORTABLE) agrees with the AVX2 one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tokenmill.native import block_matmul, ggml

sys.path.insert(0, str(Path(__file__).parent))
from gguf_blocks import quantized  # noqa: E402

pytestmark = pytest.mark.skipif(not (ggml.available() and block_matmul.panel_available()),
                                reason="needs ggml (the quantizer) and the panel kernel")
TYPES = ["Q4_0", "Q4_1", "Q8_0"]


def run(qtype: int, blocks, x: torch.Tensor, threads: int = 1, lib=None) -> torch.Tensor:
    n, (m, k), xc = blocks.shape[0], x.shape, x.contiguous()  # held: a temporary's pointer would dangle
    y = torch.full((m, n + 3), float("nan"))  # rows ldy = n + 3 apart: the kernel writes only its n columns
    block_matmul.matmul(qtype, blocks.ctypes.data, n, k, xc.data_ptr(), m, y.data_ptr(), n + 3, threads, lib, panel=True)
    assert torch.isnan(y[:, n:]).all()
    return y[:, :n]


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n, k", [(40, 32), (96, 576), (33, 1536)])
def test_against_the_dequantized_reference_and_row_independent(type_name: str, n: int, k: int) -> None:
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(23, k, generator=g)
    x[3] = 0.0  # an all-zero activation row
    x[4] *= 100.0  # and a large one
    y = run(qtype, blocks, x, threads=2)
    ref = F.linear(x.double(), w)
    for i in range(x.shape[0]):
        if i == 3:
            assert torch.equal(y[i], torch.zeros(n))
            continue
        err = float((y[i].double() - ref[i]).norm() / ref[i].norm())
        assert err < 1e-5, f"{type_name} row {i}: relative error {err:.2e}"  # fp32 sums of k products
    # every batch size (whole and partial 6-row tiles), every row offset, the thread count: the same bits
    for m in (1, 2, 5, 6, 7, 12, 13, 23):
        for start in {0, x.shape[0] - m}:
            part = run(qtype, blocks, x[start : start + m], threads=1 + m % 2)
            assert torch.equal(part, y[start : start + m]), f"{type_name}: rows depend on the batch (m={m})"


def test_row_stride_of_x_is_honoured() -> None:
    qtype, blocks, w = quantized("Q4_1", 20, 64, seed=5)
    wide = torch.randn(7, 100, generator=torch.Generator().manual_seed(4))
    lib = block_matmul.library()
    assert lib is not None
    y = torch.empty(7, 20)
    assert lib.tm_panel_matmul(qtype, blocks.ctypes.data, 20, 64, wide.data_ptr(), 100, 7, y.data_ptr(), 20, 2) == 0
    assert torch.equal(y, run(qtype, blocks, wide[:, :64]))


@pytest.mark.parametrize("type_name", TYPES)
def test_the_portable_build_agrees(type_name: str) -> None:
    portable = block_matmul.library(block_matmul.FLAGS + ("-DTM_PORTABLE",))
    assert portable is not None
    qtype, blocks, w = quantized(type_name, 48, 576, seed=7)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(2))
    a, b = run(qtype, blocks, x), run(qtype, blocks, x, lib=portable)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    assert torch.equal(run(qtype, blocks, x[2:3], lib=portable), b[2:3])  # row independent there too


def test_unsupported_types_and_shapes_are_refused() -> None:
    lib = block_matmul.library()
    assert lib is not None
    assert not lib.tm_panel_matmul_supports(12)  # Q4_K: ggml's kernels
    assert lib.tm_panel_matmul(12, None, 1, 32, None, 32, 1, None, 1, 1) == -1
    assert lib.tm_panel_matmul(2, None, 1, 48, None, 48, 1, None, 1, 1) == -2  # K not a multiple of 32
