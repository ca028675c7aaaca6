"""Paged attention in plain PyTorch (CPU and CUDA): write new K/V into cache slots, attend over blocks.

Cache layout per layer: k_cache, v_cache of shape (num_blocks, block_size, num_kv_heads, head_dim).
A token at position p of a request lives in slot  block_table[p // bs] * bs + p % bs.

    block table [7, 2, 9]  (bs = 4)
    positions    0 1 2 3 | 4 5 6 7 | 8 9
    slots       28..31   |  8..11  | 36 37

A step's tokens are ordered decodes first (one token each), then prefill chunks. Decodes attend as one
padded batch over their gathered blocks; each prefill chunk attends over its cached prefix plus itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from tokenmill.worker.decode_mirror import MirrorStep


@dataclass
class PrefillChunk:
    q_start: int  # offset of the chunk's first token in the step's token axis
    q_len: int
    start: int  # position of the chunk's first token (== tokens already in the cache)
    block_table: torch.Tensor  # (num_blocks_of_request,) int64, on device


@dataclass
class AttentionMetadata:
    """Built once per step by the runner and passed to every layer (never a global)."""

    slot_mapping: torch.Tensor  # (T,) int64: cache slot of each new token
    num_decodes: int  # the first num_decodes tokens are decodes
    decode_block_tables: torch.Tensor | None  # (D, max_blocks) int64, padded with 0
    decode_mask: torch.Tensor | None  # (D, 1, 1, max_blocks * bs) bool: True where the key is valid
    prefills: list[PrefillChunk]
    mirror: MirrorStep | None = None  # set: decodes read their K/V from contiguous rows instead of blocks


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: (T, nkv, hd) -> their slots in the caches."""
    nkv, hd = k.shape[1], k.shape[2]
    k_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, nkv, hd).index_copy_(0, slot_mapping, v)


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """cache (NB, bs, nkv, hd), block_ids (...,) -> (..., bs, nkv, hd), a copy.
    index_select over whole-block rows runs near memcpy speed; advanced indexing (cache[ids]) was
    measured 2-4x slower on CPU for the same bytes."""
    flat = torch.index_select(cache.view(cache.shape[0], -1), 0, block_ids.reshape(-1))
    return flat.view(*block_ids.shape, *cache.shape[1:])


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, layer: int) -> torch.Tensor:
    """q: (T, nh, hd); k, v: (T, nkv, hd), already written to the cache. Returns (T, nh, hd)."""
    out = torch.empty_like(q)
    nkv, hd = k.shape[1], k.shape[2]
    bs = k_cache.shape[1]
    d = meta.num_decodes
    if d and meta.mirror is not None:
        m = meta.mirror
        kb, vb = m.k[layer], m.v[layer]  # (S, nkv, cap, hd)
        kb[m.slots, :, m.positions] = k[:d]  # append this step's token to each row
        vb[m.slots, :, m.positions] = v[:d]
        qd = q[:d].unsqueeze(2)  # (D, nh, 1, hd)
        o = F.scaled_dot_product_attention(qd, kb[:d, :, : m.max_len], vb[:d, :, : m.max_len], attn_mask=m.mask,
                                           scale=scale, enable_gqa=True)
        out[:d] = o.squeeze(2)
    elif d:
        assert meta.decode_block_tables is not None and meta.decode_mask is not None
        tables = meta.decode_block_tables
        kd = gather_blocks(k_cache, tables).view(d, -1, nkv, hd).transpose(1, 2)  # (D, nkv, L, hd)
        vd = gather_blocks(v_cache, tables).view(d, -1, nkv, hd).transpose(1, 2)
        qd = q[:d].unsqueeze(2)  # (D, nh, 1, hd)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True)
        out[:d] = o.squeeze(2)
    for c in meta.prefills:
        # 4-D (1, heads, len, hd): with 3-D inputs SDPA falls back to its math kernel on CPU, measured
        # 2x (fp32) to 13x (bf16) slower than the flash kernel it picks for 4-D ones
        qs = q[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None]  # (1, nh, q_len, hd)
        if c.start == 0:  # no cached prefix: the chunk's own K/V, causal
            ks = k[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None]
            vs = v[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:  # cached prefix + chunk: gather the blocks, causal with an offset
            ctx = c.start + c.q_len
            nb = -(-ctx // bs)  # ks, vs: (1, nkv, ctx, hd)
            ks = gather_blocks(k_cache, c.block_table[:nb]).view(-1, nkv, hd)[:ctx].transpose(0, 1)[None]
            vs = gather_blocks(v_cache, c.block_table[:nb]).view(-1, nkv, hd)[:ctx].transpose(0, 1)[None]
            qpos = torch.arange(c.start, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]  # (q_len, ctx)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[c.q_start : c.q_start + c.q_len] = o[0].transpose(0, 1)
    return out
