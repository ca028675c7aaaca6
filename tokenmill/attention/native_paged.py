"""The paged backend with decode attention by the native CPU kernel (tokenmill/native/kernels.cpp).

Decodes attend over the paged cache where it lies: the kernel walks each sequence's block table, so
there is no per-step gather of every block (the paged backend) and no contiguous copy to keep in step
(the decode mirror). Prefill chunks, and everything the kernel does not take (a dtype other than fp32 or
bf16, a head dim not a multiple of 8, the kernels switched off or not built), take the paged backend's
torch path. Each sequence's result depends on its own K/V only, never on the rest of the batch.
"""

from __future__ import annotations

import logging

import torch

from tokenmill.attention.backend import AttentionMetadata, AttentionStep
from tokenmill.attention.paged import PagedAttentionBackend
from tokenmill.native import kernels

log = logging.getLogger(__name__)


class NativePagedAttentionBackend(PagedAttentionBackend):
    name = "native"

    def __init__(self, block_size: int, device: torch.device, kv: torch.Tensor) -> None:
        """kv: the whole paged cache, (2, layers, num_blocks, block_size, nkv, hd)."""
        super().__init__(block_size, device)
        self.use_kernel = (device.type == "cpu" and kernels.supports_dtype(kv.dtype) and kv.shape[-1] % 8 == 0
                           and kernels.is_enabled())
        if not self.use_kernel:
            log.info("native decode attention does not take %s K/V of head dim %d on %s (or the native kernels "
                     "are off): decodes gather their blocks as the paged backend does", kv.dtype, kv.shape[-1],
                     device)

    def build_metadata(self, step: AttentionStep) -> AttentionMetadata:
        if not self.use_kernel or not step.decodes:
            return super().build_metadata(step)
        decodes = step.decodes
        max_blocks = max(len(s.block_table) for s in decodes)
        tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in decodes],
                              dtype=torch.long, device=self.device)
        meta = self._metadata(step, list(range(len(decodes))), tables, None)
        meta.decode_context_lens = torch.tensor([s.start + 1 for s in decodes], dtype=torch.long, device=self.device)
        return meta

    def decode_attention(self, out: torch.Tensor, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                         scale: float, window: int = 0) -> None:
        d, lens, tables = meta.num_decodes, meta.decode_context_lens, meta.decode_block_tables
        if lens is not None and tables is not None:
            starts = None  # (D,) int64: each decode's first key position, lens - W, once per step and window
            if window > 0:
                starts = meta.window_cache.get(("starts", window))
                if starts is None:
                    starts = meta.window_cache[("starts", window)] = (lens - window).clamp_(min=0)
            if kernels.paged_decode_attention(out[:d], q[:d], kv_cache[0], kv_cache[1], tables, lens, scale,
                                              starts=starts):
                return
            if meta.decode_mask is None:  # tensors the kernel did not take (a stride): the masked gather
                keys = torch.arange(tables.shape[1] * self.block_size, device=lens.device)
                meta.decode_mask = (keys[None, :] < lens[:, None])[:, None, None, :]
        super().decode_attention(out, layer_idx, q, k, v, kv_cache, meta, scale, window)
