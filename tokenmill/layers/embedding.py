"""Token embedding: a (vocab, hidden) table looked up by id.

With a linear method that keeps ggml blocks (gguf), the table stays as its blocks and a step dequantizes
only the rows it gathers; a tied output layer multiplies by the same blocks, and where the method repacks
those for the 16-bit VNNI kernel (layers/ggml_linear.py, _packs) the gather reads the packed ones
(share_packed_head).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, method: Any = None) -> None:
        super().__init__()
        # torch.empty, not nn.Embedding's random init: the checkpoint overwrites it (and an 8B model's
        # table would take seconds to initialise)
        self.embedding_dim = embedding_dim
        self.blocks: Any = None  # GGUFQuantized when the method keeps blocks
        # (ggml type, address, rows) of the tied output layer's packed blocks, gathered from instead (the file's
        # pages were released when they were packed); None: the blocks above
        self.packed_rows: tuple[int, int, int] | None = None
        if method is not None and method.keeps_blocks:
            self.weight = nn.Parameter(torch.empty(0), requires_grad=False)
            self.weight.weight_loader = self._load_blocks(method)  # type: ignore[attr-defined]
        else:
            self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.shape = (num_embeddings, embedding_dim)

    def _load_blocks(self, method: Any) -> Any:
        def load(param: nn.Parameter, tensor: Any, shard: str | None) -> None:
            if tuple(tensor.shape) != self.shape:
                raise ValueError(f"embedding has shape {tuple(tensor.shape)}, expected {self.shape}")
            self.blocks = method.to_blocks(tensor)
        return load

    def share_packed_head(self, head: Any) -> None:
        """The tied output layer `head` (a Linear on this table's blocks) after its finish_loading: where its
        method packed the blocks (one part, a type code with block_matmul.PACKED), gather from those."""
        from tokenmill.native import block_matmul

        parts = head.block_mm
        if self.blocks is None or not parts or len(parts) != 1 or not parts[0][0] & block_matmul.PACKED:
            return
        code, ptr, rows, _ = parts[0]
        assert rows == self.shape[0] and code & ~block_matmul.PACKED == int(self.blocks.ggml_type)
        self.packed_rows = (code & ~block_matmul.PACKED, ptr, rows)
        self._head = head  # keeps the packed buffers' owner alive with this table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) int64 -> (T, embedding_dim)."""
        if self.blocks is None:
            return F.embedding(input_ids, self.weight)
        from tokenmill.native import ggml

        ids = input_ids.to(torch.int64).contiguous()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.shape[0]):
            raise IndexError(f"token id out of range [0, {self.shape[0]})")
        if self.blocks.type_name == "f32":  # F32 rows are the values (ggml has nothing to dequantize)
            return torch.from_numpy(self.blocks.data.view(np.float32)[ids.numpy()]).to(self.weight.dtype)
        out = torch.empty(ids.shape[0], self.embedding_dim)
        if self.packed_rows is not None:  # the rows back as the file's blocks, then dequantized
            from tokenmill.native import block_matmul

            qtype, ptr, rows = self.packed_rows
            plain = np.empty((ids.shape[0], ggml.row_size(qtype, self.embedding_dim)), dtype=np.uint8)
            block_matmul.unpack_rows(qtype, ptr, rows, self.embedding_dim, ids.data_ptr(), ids.shape[0],
                                     plain.ctypes.data)
            if ids.shape[0]:
                ggml.dequantize(qtype, plain.ctypes.data, ids.shape[0], self.embedding_dim, out.data_ptr(), 1)
            return out.to(self.weight.dtype)
        ggml.get_rows(int(self.blocks.ggml_type), self.blocks.data.ctypes.data, self.embedding_dim, ids.data_ptr(),
                      ids.shape[0], out.data_ptr())
        return out.to(self.weight.dtype)
