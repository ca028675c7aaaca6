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
