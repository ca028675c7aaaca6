"""The paged backend, in plain PyTorch (CPU and CUDA): write new K/V into cache slots, attend over blocks.

Cache layout per layer: k_cache, v_cache of shape (num_blocks, block_size, num_kv_heads, head_dim).
A token at position p of a request lives in slot  block_table[p // bs] * bs + p % bs.

    block table [7, 2, 9]  (bs = 4)
    positions    0 1 2 3 | 4 5 6 7 | 8 9
    slots       28..31   |  8..11  | 36 37

A step's tokens are ordered decodes first (one token each), then prefill chunks. Decodes attend as one
padded batch over their gathered blocks; each prefill chunk attends over its cached prefix plus itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.attention.backend import (AttentionBackend, AttentionMetadata, AttentionStep, PrefillChunk,
                                         ScheduledSeq)


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


def slot_mapping(seqs: list[ScheduledSeq], block_size: int) -> list[int]:
    """The cache slot of every token of `seqs`, in order."""
    bs = block_size
    slots: list[int] = []
    for s in seqs:
        table = s.block_table
        slots.extend(table[p // bs] * bs + p % bs for p in range(s.start, s.start + s.num_tokens))
    return slots


def prefill_chunks(prefills: list[ScheduledSeq], q_offset: int, device: torch.device) -> list[PrefillChunk]:
    chunks: list[PrefillChunk] = []
    q_start = q_offset
    for s in prefills:
        chunks.append(PrefillChunk(q_start, s.num_tokens, s.start,
                                   torch.tensor(s.block_table, dtype=torch.long, device=device)))
        q_start += s.num_tokens
    return chunks


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
           softcap: float = 0.0, is_causal: bool = False, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, nh, Lq, hd), k and v (B, nkv, Lk, hd) -> (B, nh, Lq, hd): SDPA (GQA, a bool mask where True is
    seen, or causal). With softcap > 0 each score s is first soft-capped, cap * tanh(s / cap) (Gemma 2), and
    with sinks (nh,) each head's softmax has one more logit that selects no value (gpt-oss); SDPA has no
    option for either: the same attention in explicit steps, in fp32, then q's dtype, a slice of queries
    at a time (a (B, nh, rows, Lk) block of scores at most EXPLICIT_SCORES floats)."""
    if softcap <= 0 and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=True)
    B, nh, lq, _ = q.shape
    lk = k.shape[2]
    rep = nh // k.shape[1]
    kf, vf = k.float(), v.float()
    if rep > 1:  # each kv head serves `rep` consecutive query heads, as enable_gqa pairs them
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    if is_causal:  # Lq == Lk here: query i sees keys 0..i
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    rows = max(1, EXPLICIT_SCORES // max(1, B * nh * lk))
    for r0 in range(0, lq, rows):
        r1 = min(lq, r0 + rows)
        scores = torch.matmul(q[:, :, r0:r1].float(), kf.transpose(-1, -2)) * scale  # (B, nh, rows, Lk)
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores.masked_fill(~(mask if mask.shape[-2] == 1 else mask[..., r0:r1, :]), float("-inf"))
        if sinks is None:
            probs = torch.softmax(scores, dim=-1)
        else:  # the sink's column joins the softmax, then leaves: its weight goes nowhere
            sink = sinks.float().view(1, nh, 1, 1).expand(B, nh, r1 - r0, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :lk]
        out[:, :, r0:r1] = torch.matmul(probs, vf).to(q.dtype)
    return out


# the explicit attention's score blocks: at most this many floats (256 MB) at once
EXPLICIT_SCORES = 64 * 2**20


def prefill_attention(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, chunks: list[PrefillChunk], scale: float, window: int = 0,
                      softcap: float = 0.0, sinks: torch.Tensor | None = None) -> None:
    """Each chunk attends over its cached prefix plus itself (causal; with window W > 0 over the last W
    keys of each query only; scores soft-capped when softcap > 0; sinks as attend's); results go into `out`
    (T, nh, hd)."""
    nkv, hd = k.shape[1], k.shape[2]
    bs = k_cache.shape[1]
    for c in chunks:
        # 4-D (1, heads, len, hd): with 3-D inputs SDPA falls back to its math kernel on CPU, measured
        # 2x (fp32) to 13x (bf16) slower than the flash kernel it picks for 4-D ones; and contiguous: on
        # strided views of the (T, heads, hd) rows its bf16 kernel took 1.23x as long (200 tokens, 9 / 3
        # heads: 0.90 against 0.73 ms, same bits), more than the copies cost
        qs = q[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None].contiguous()  # (1, nh, q_len, hd)
        qpos = torch.arange(c.start, c.start + c.q_len, device=q.device)
        if c.start == 0:  # no cached prefix: the chunk's own K/V, causal
            ks = k[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None].contiguous()
            vs = v[c.q_start : c.q_start + c.q_len].transpose(0, 1)[None].contiguous()
            if window <= 0 or c.q_len <= window:  # the window covers the whole chunk
                o = attend(qs, ks, vs, None, scale, softcap, is_causal=True, sinks=sinks)
            else:
                o = attend(qs, ks, vs, _causal_mask(qpos, qpos, window), scale, softcap, sinks=sinks)
        else:  # cached prefix + chunk: gather the blocks from the first one the window reaches
            ctx = c.start + c.q_len
            first = max(0, c.start - window + 1) // bs if window > 0 else 0  # blocks before it are unseen
            nb = -(-ctx // bs)
            k0 = first * bs  # ks, vs: (1, nkv, ctx - k0, hd), keys at positions [k0, ctx)
            ks = gather_blocks(k_cache, c.block_table[first:nb]).view(-1, nkv, hd)[: ctx - k0].transpose(0, 1)[None]
            vs = gather_blocks(v_cache, c.block_table[first:nb]).view(-1, nkv, hd)[: ctx - k0].transpose(0, 1)[None]
            ks, vs = ks.contiguous(), vs.contiguous()
            kpos = torch.arange(k0, ctx, device=q.device)
            o = attend(qs, ks, vs, _causal_mask(qpos, kpos, window), scale, softcap, sinks=sinks)
        out[c.q_start : c.q_start + c.q_len] = o[0].transpose(0, 1)


def _causal_mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    """(q_len, k_len) bool, True where query position qpos[i] sees key position kpos[j]: j's position is
    not after i's, and (window W > 0) within the last W: qpos - W < kpos <= qpos."""
    mask = kpos[None, :] <= qpos[:, None]
    if window > 0:
        mask &= kpos[None, :] > qpos[:, None] - window
    return mask


def window_decode_blocks(meta: AttentionMetadata, block_size: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The decodes' blocks that a window of W keys reaches, and their mask, once per step and window:

        tables (D, nw) int64: decode b's blocks first_b .. first_b + nw - 1, first_b = (len_b - W)+ // bs
                              (past its last block: the last block again, masked)
        mask (D, 1, 1, nw * bs) bool: key j of row b is position first_b * bs + j; True where
                              len_b - W <= position < len_b

    So a long context gathers only its window's blocks, never the ones that left it (which, with every
    layer windowed, the block manager has freed and another request may be writing)."""
    key = ("decode_tables", window)
    tables = meta.window_cache.get(key)
    if tables is None:
        lens, full = meta.decode_context_lens, meta.decode_block_tables
        assert lens is not None and full is not None
        first = (lens - window).clamp(min=0) // block_size  # (D,)
        nw = int(((lens - 1) // block_size - first).max()) + 1
        idx = first[:, None] + torch.arange(nw, device=lens.device)[None, :]  # (D, nw) logical block indices
        tables = meta.window_cache[key] = full.gather(1, idx.clamp(max=full.shape[1] - 1))
        pos = (first * block_size)[:, None] + torch.arange(nw * block_size, device=lens.device)[None, :]
        mask = (pos < lens[:, None]) & (pos >= lens[:, None] - window)
        meta.window_cache[("decode_mask", window)] = mask[:, None, None, :]
    return tables, meta.window_cache[("decode_mask", window)]


class PagedAttentionBackend(AttentionBackend):
    """Decodes attend as one padded batch over their gathered blocks; each prefill chunk attends over its
    cached prefix plus itself."""

    name = "paged"
    multi_token_decode = True  # write_kv for the whole step first, decode order kept

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.device = device

    def build_metadata(self, step: AttentionStep) -> AttentionMetadata:
        dev, bs = self.device, self.block_size
        decodes = step.decodes
        decode_tables = decode_mask = None
        if decodes:
            max_blocks = max(len(s.block_table) for s in decodes)
            tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in decodes]
            decode_tables = torch.tensor(tables, dtype=torch.long, device=dev)
            ctx = torch.tensor([s.start + 1 for s in decodes], dtype=torch.long, device=dev)
            decode_mask = (torch.arange(max_blocks * bs, device=dev)[None, :] < ctx[:, None])[:, None, None, :]
        meta = self._metadata(step, list(range(len(decodes))), decode_tables, decode_mask)
        if decodes:
            meta.decode_context_lens = ctx
        return meta

    def _metadata(self, step: AttentionStep, order: list[int], decode_tables: torch.Tensor | None,
                  decode_mask: torch.Tensor | None, extra: object | None = None) -> AttentionMetadata:
        decodes = [step.decodes[i] for i in order]
        slots = slot_mapping(decodes + step.prefills, self.block_size)
        return AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device), num_decodes=len(decodes),
            decode_block_tables=decode_tables, decode_mask=decode_mask,
            prefills=prefill_chunks(step.prefills, len(decodes), self.device), decode_order=order, extra=extra)

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, scale: float,
                sliding_window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        chunks = self.attend_rows(out, q, kv_cache, meta, scale, sliding_window, softcap, sinks)
        if chunks is None:
            chunks = 0
            if meta.num_decodes:
                self.decode_attention(out, layer_idx, q, k, v, kv_cache, meta, scale, sliding_window, softcap,
                                      sinks)
        prefill_attention(out, q, k, v, k_cache, v_cache, meta.prefills[chunks:], scale, sliding_window, softcap,
                          sinks)
        return out

    def attend_rows(self, out: torch.Tensor, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                    meta: AttentionMetadata, scale: float, window: int = 0, softcap: float = 0.0,
                    sinks: torch.Tensor | None = None) -> int | None:
        """A backend's one pass over the decodes and the first prefill chunks together (their K/V already
        written): fills their rows of out and returns how many chunks it took; None when it took nothing
        (decode_attention and prefill_attention then do it all). Here: None."""
        return None

    def decode_attention(self, out: torch.Tensor, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                         scale: float, window: int = 0, softcap: float = 0.0,
                         sinks: torch.Tensor | None = None) -> None:
        """The first num_decodes tokens: one query each over its gathered blocks -> out[:D]; with a window,
        over the blocks the window reaches (window_decode_blocks); scores soft-capped when softcap > 0; sinks
        as attend's."""
        assert meta.decode_block_tables is not None and meta.decode_mask is not None
        d, nkv, hd = meta.num_decodes, k.shape[1], k.shape[2]
        tables, mask = meta.decode_block_tables, meta.decode_mask
        if window > 0:
            tables, mask = window_decode_blocks(meta, self.block_size, window)
        kd = gather_blocks(kv_cache[0], tables).view(d, -1, nkv, hd).transpose(1, 2)  # (D, nkv, L, hd)
        vd = gather_blocks(kv_cache[1], tables).view(d, -1, nkv, hd).transpose(1, 2)
        qd = q[:d].unsqueeze(2)  # (D, nh, 1, hd)
        out[:d] = attend(qd, kd, vd, mask, scale, softcap, sinks=sinks).squeeze(2)
