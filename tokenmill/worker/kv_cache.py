"""The paged KV cache's memory: one tensor for all layers, and a (k, v) view per layer."""

from __future__ import annotations

import torch


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(2, layers, blocks, block_size, nkv, hd), zeroed so that its pages are committed now: the memory
    the plan promised is taken at start, and RSS stays flat afterwards (with torch.empty it crept up as
    the LRU free queue cycled through never-touched blocks)."""
    return torch.zeros((2, num_layers, num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device)


def per_layer_views(kv: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(k_cache, v_cache)] per layer, each (blocks, block_size, nkv, hd), views into kv."""
    return [(kv[0, i], kv[1, i]) for i in range(kv.shape[1])]
