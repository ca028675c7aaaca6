"""A random matrix quantized by ggml to plain GGUF blocks, with gguf-py's dequantization of it (fp64): the
input and the reference of the block-kernel tests (test_block_matmul.py, test_amx_matmul.py)."""

from __future__ import annotations

import numpy as np
import torch

from tokenmill.native import ggml


def quantized(type_name: str, n: int, k: int, seed: int) -> tuple[int, np.ndarray, torch.Tensor]:
    """-> (ggml type, (n, row bytes) uint8 blocks, (n, k) fp64 dequantized). Row 0 is all zeros (scale 0)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = int(GGMLQuantizationType[type_name])
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0] = 0.0
    blocks = np.empty((n, ggml.row_size(qtype, k)), dtype=np.uint8)
    ggml.quantize(qtype, w.numpy().ctypes.data, blocks.ctypes.data, n, k)
    return qtype, blocks, torch.from_numpy(dequantize(blocks, GGMLQuantizationType(qtype)).reshape(n, k).astype(np.float64))


def multiply(qtype: int, blocks: np.ndarray, x: torch.Tensor, threads: int = 1, lib=None, amx: bool = False,
             panel: bool = False, vnni: int = 0, rows: int | None = None) -> torch.Tensor:
    """x (m, k) . W^T on one of block_matmul's kernels (the block kernel; amx: the AMX one; panel: the fp32
    panel one; vnni: the VNNI panel rounding x to 8 or 16 bits), into rows n + 3 apart, checking that the
    kernel writes only its n columns -> (m, n). n: blocks' rows, or `rows` (a packed buffer's)."""
    from tokenmill.native import block_matmul

    n, (m, k), xc = rows or blocks.shape[0], x.shape, x.contiguous()  # xc held: a temporary's pointer would dangle
    y = torch.full((m, n + 3), float("nan"))
    block_matmul.matmul(qtype, blocks.ctypes.data, n, k, xc.data_ptr(), m, y.data_ptr(), n + 3, threads, lib,
                        amx=amx, panel=panel or bool(vnni), vnni=vnni)
    assert torch.isnan(y[:, n:]).all()
    return y[:, :n]
