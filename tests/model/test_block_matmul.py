"""native/block_matmul.cpp, the multi-row kernel for plain Q4_0 / Q4_1 / Q8_0 blocks, and native/panel_matmul.cpp,
the fp32 panel kernel for batches of rows over the same blocks: against the dequantized fp64 reference
(gguf-py's dequantizer; the block kernel rounds x to 16 bits, so within 1e-4; the panel takes it at fp32),
row by row independent of the batch, the row tiling and the thread count; the plain C++ builds
(-DTM_PORTABLE) agree with the AVX2 ones."""

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

pytestmark = pytest.mark.skipif(not (ggml.available() and block_matmul.available()),
                                reason="needs ggml (the quantizer) and the block matmul kernel")
TYPES = ["Q4_0", "Q4_1", "Q8_0"]
K_TYPES = ["Q4_K", "Q5_K", "Q6_K"]  # kquant_matmul.cpp (the panel entry hands them to it)


@pytest.mark.parametrize("panel", [False, True], ids=["blocks", "panel"])
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n, k", [(40, 32), (96, 576), (33, 1536)])
def test_against_the_dequantized_reference_and_row_independent(type_name: str, n: int, k: int, panel: bool) -> None:
    """The block kernel (x rounded to 16 bits) and the panel kernel (x at fp32) against fp64; each gives a row
    the same bits whatever the batch (8-row tiles there, 6-row tiles and 16-column panels here), the row's
    place in it and the thread count."""
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(23, k, generator=g)
    x[3] = 0.0  # an all-zero activation row
    x[4] *= 100.0  # and a large one
    _check_against_reference(type_name, qtype, blocks, w, x, panel)


@pytest.mark.parametrize("type_name", K_TYPES)
@pytest.mark.parametrize("n, k", [(40, 256), (33, 768), (17, 1536)])
def test_k_quants_against_the_dequantized_reference_and_row_independent(type_name: str, n: int, k: int) -> None:
    """Q4_K, Q5_K and Q6_K (the types of Q4_K_M and Q5_K_M files) on the block kernel: within 1e-4 of fp64 from 16-bit
    activations, each row the same bits whatever the batch, its place in it and the thread count."""
    qtype, blocks, w = quantized(type_name, n, k, seed=n + k)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(23, k, generator=g)
    x[3] = 0.0
    x[4] *= 100.0
    x[5, : k // 2] *= 1e-3  # blocks of very different scales in one row
    _check_against_reference(type_name, qtype, blocks, w, x, panel=False)


def _check_against_reference(type_name: str, qtype: int, blocks, w: torch.Tensor, x: torch.Tensor,
                             panel: bool) -> None:
    n = blocks.shape[0]
    y = multiply(qtype, blocks, x, threads=2, panel=panel)
    ref = F.linear(x.double(), w)
    for i in range(x.shape[0]):
        if i == 3:
            assert torch.equal(y[i], torch.zeros(n))
            continue
        err = float((y[i].double() - ref[i]).norm() / ref[i].norm())
        # 16-bit activations: x's rounding only, ~1e-5 (8-bit ones, ggml's, give ~5e-3); fp32 ones ~1e-7
        assert err < (1e-5 if panel else 1e-4), f"{type_name} row {i}: relative error {err:.2e}"
    for m in (1, 2, 3, 5, 6, 7, 8, 9, 12, 13, 16, 19, 23):
        for start in {0, x.shape[0] - m}:
            part = multiply(qtype, blocks, x[start : start + m], threads=1 + m % 3, panel=panel)
            assert torch.equal(part, y[start : start + m]), f"{type_name}: rows depend on the batch (m={m})"


def test_panel_honours_the_row_stride_of_x() -> None:
    qtype, blocks, w = quantized("Q4_1", 20, 64, seed=5)
    wide = torch.randn(7, 100, generator=torch.Generator().manual_seed(4))
    lib = block_matmul.library()
    assert lib is not None
    y = torch.empty(7, 20)
    assert lib.tm_panel_matmul(qtype, blocks.ctypes.data, 20, 64, wide.data_ptr(), 100, 7, y.data_ptr(), 20, 2) == 0
    assert torch.equal(y, multiply(qtype, blocks, wide[:, :64], panel=True))


@pytest.mark.parametrize("panel", [False, True], ids=["blocks", "panel"])
@pytest.mark.parametrize("type_name", TYPES + K_TYPES)
def test_the_portable_build_agrees(type_name: str, panel: bool) -> None:
    """The plain C++ build of the block kernel and of the panel kernel (panel_matmul.cpp) against AVX2's."""
    portable = block_matmul.library(block_matmul.FLAGS + ("-DTM_PORTABLE",))
    assert portable is not None
    k = 768 if type_name in K_TYPES else 576
    qtype, blocks, w = quantized(type_name, 48, k, seed=7)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    a, b = multiply(qtype, blocks, x, panel=panel), multiply(qtype, blocks, x, lib=portable, panel=panel)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    assert torch.equal(multiply(qtype, blocks, x[2:3], lib=portable, panel=panel), b[2:3])  # row independent there too


@pytest.mark.parametrize("type_name", K_TYPES)
def test_the_k_quants_avx2_code_agrees_with_avx512s(type_name: str) -> None:
    """kquant_matmul.cpp's 256-bit code (built with -DTM_NO_AVX512, as on an AVX2-only CPU) against its 512-bit
    code: the same integer sums per sub-block, added in another order (on a CPU without AVX-512 both builds
    are the 256-bit code)."""
    avx2 = block_matmul.library(block_matmul.FLAGS + ("-DTM_NO_AVX512",))
    assert avx2 is not None
    qtype, blocks, w = quantized(type_name, 40, 1024, seed=11)
    x = torch.randn(11, 1024, generator=torch.Generator().manual_seed(5))
    a, b = multiply(qtype, blocks, x, threads=2), multiply(qtype, blocks, x, threads=2, lib=avx2)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    assert torch.equal(multiply(qtype, blocks, x[4:5], lib=avx2), b[4:5])


def _extreme_blocks(type_name: str, n: int, k: int, sign: int) -> np.ndarray:
    """n rows of k weights, every one at the type's largest |scale * quant| (sign -1: the most negative one
    Q6_K has): Q4_K, Q5_K all quants 15 / 31 and all 6-bit scales 63, mins 0; Q6_K all scales -128, quants 0
    (-32 * -128 = 4096) or 63 (31 * -128)."""
    d = np.array([2.0 ** -10], dtype=np.float16).view(np.uint8)
    if type_name == "Q6_K":  # ql[128] qh[64] scales[16] d
        q = 0 if sign > 0 else 0xFF
        block = np.concatenate([np.full(192, q, np.uint8), np.full(16, 0x80, np.uint8), d])
    else:  # d dmin scales[12] (qh[32]) qs[128]
        scales = np.array([0xFF] * 4 + [0] * 4 + [0x0F] * 4, np.uint8)  # sc 63, m 0 for all eight
        quants = np.full(160 if type_name == "Q5_K" else 128, 0xFF, np.uint8)
        block = np.concatenate([d, np.zeros(2, np.uint8), scales, quants])
    return np.tile(block, (n, k // 256))


@pytest.mark.parametrize("type_name, sign", [("Q4_K", 1), ("Q5_K", 1), ("Q6_K", 1), ("Q6_K", -1)])
def test_k_quant_sums_stay_exact_at_the_extremes(type_name: str, sign: int) -> None:
    """Q5_K and Q6_K sum a super-block's products in int32 lanes (kquant_matmul.cpp's kXMax): with every weight
    at its largest magnitude and x constant (every product at its largest, all of one sign) the result is still
    the reference's (to x's rounding: a wrapped lane would be off by far more), on the 512-bit, 256-bit and plain
    C++ builds."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    n, k = 16, 1024
    blocks = _extreme_blocks(type_name, n, k, sign)
    qtype = int(GGMLQuantizationType[type_name])
    w = torch.from_numpy(dequantize(blocks, GGMLQuantizationType(qtype)).reshape(n, k).astype(np.float64))
    assert float(w.abs().min()) > 0 and (w > 0).all() == (sign > 0 or type_name != "Q6_K")
    x = torch.ones(3, k)
    x[1] *= -7.5
    x[2, ::2] = 0.5  # not constant: x's largest value maps to the largest quant, the rest below it
    ref = F.linear(x.double(), w)
    for lib in (None, block_matmul.library(block_matmul.FLAGS + ("-DTM_NO_AVX512",)),
                block_matmul.library(block_matmul.FLAGS + ("-DTM_PORTABLE",))):
        y = multiply(qtype, blocks, x, threads=2, lib=lib)
        err = float(((y.double() - ref).norm(dim=1) / ref.norm(dim=1)).max())
        assert err < 1e-4, f"{type_name}: relative error {err:.2e}"


@pytest.mark.parametrize("kernel", ["tm_block_matmul", "tm_panel_matmul", "tm_vnni_matmul", "tm_vnni16_matmul"])
def test_unsupported_types_and_shapes_are_refused(kernel: str) -> None:
    lib = block_matmul.library()
    assert lib is not None
    fn = getattr(lib, kernel)  # both take the types tm_block_matmul_supports names
    assert not lib.tm_block_matmul_supports(11)  # Q3_K: ggml's kernels
    assert fn(11, None, 1, 256, None, 256, 1, None, 1, 1) == -1
    assert fn(2, None, 1, 48, None, 48, 1, None, 1, 1) == -2  # K not a multiple of 32
    assert fn(12, None, 1, 288, None, 288, 1, None, 1, 1) == -2  # a K-quant's K not a multiple of 256


@pytest.mark.parametrize("type_name", TYPES + K_TYPES)
def test_grouped_equals_one_call_per_group(type_name: str) -> None:
    """A mixture of experts' layer in one call: each group's rows are exactly the single call's, empty
    groups included, whatever the thread count."""
    k = 256 if type_name in K_TYPES else 64
    mats = [quantized(type_name, 40, k, seed=s) for s in range(4)]
    counts = [3, 0, 9, 1]
    x = torch.randn(sum(counts), k, generator=torch.Generator().manual_seed(3))
    for threads in (1, 2):
        y = torch.empty(sum(counts), 40)
        block_matmul.matmul_grouped(mats[0][0], [m[1].ctypes.data for m in mats], counts, 40, k,
                                    x.data_ptr(), y.data_ptr(), threads)
        r0 = 0
        for (qtype, blocks, _), c in zip(mats, counts):
            if c:
                assert torch.equal(y[r0 : r0 + c], multiply(qtype, blocks, x[r0 : r0 + c]))
            r0 += c
