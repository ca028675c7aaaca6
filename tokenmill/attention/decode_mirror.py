"""DecodeMirror: contiguous copies of the KV of the requests that are decoding, one row ("slot") each.

Paged attention on CPU has to gather every block of every decoding request at every layer and every
step, only to append one token's K/V: at batch 64 and ~300 tokens of context that is ~0.9 GB of copies
per step. The mirror keeps each decoding request's K/V in a row of one dense tensor per layer, so a
decode step appends one token per row and attention reads the rows in place.

    k, v: (layers, S, nkv, cap, hd)     slots 0..n-1 in use, compact, in the order of this step's decodes
    row i holds positions [0, lengths[i]) of request ids[i]

The paged cache stays the source of truth (prefix caching, preemption, prefill): a request that is new
to the mirror, or whose row is stale, is filled from its blocks once. A request that does not decode in
a step leaves the mirror (the last row moves into its hole). When the decodes of a step would not fit
the memory budget, `plan` returns None and attention gathers from the blocks as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.attention.backend import AttentionMetadata, AttentionStep
from tokenmill.attention.paged import PagedAttentionBackend, attend


@dataclass
class MirrorStep:
    """What one step's decode attention needs (decodes are in slot order 0..D-1)."""

    k: torch.Tensor  # (layers, S, nkv, cap, hd)
    v: torch.Tensor
    slots: torch.Tensor  # (D,) == arange(D)
    positions: torch.Tensor  # (D,) where each decode's new K/V goes in its row
    max_len: int  # attend over [0, max_len) of every row
    mask: torch.Tensor  # (D, 1, 1, max_len) bool: True where the key is valid


class DecodeMirror:
    def __init__(self, kv: torch.Tensor, budget_bytes: int) -> None:
        """kv: the paged cache, (2, layers, num_blocks, block_size, nkv, hd)."""
        self.kv = kv
        self.budget_bytes = budget_bytes
        _, self.num_layers, _, self.block_size, self.nkv, self.hd = kv.shape
        self.bytes_per_token = 2 * self.num_layers * self.nkv * self.hd * kv.element_size()
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.ids: list[str] = []
        self.lengths: list[int] = []

    @property
    def capacity(self) -> tuple[int, int]:
        return (0, 0) if self.k is None else (self.k.shape[1], self.k.shape[3])

    def reset(self) -> None:
        self.k = self.v = None
        self.ids, self.lengths = [], []

    def plan(self, request_ids: list[str], starts: list[int], block_tables: list[list[int]]) -> list[int] | None:
        """Make rows hold positions [0, start) of each decoding request. Returns the slot order: the i-th
        entry is the index (into request_ids) of the request in slot i. None: use the gather path."""
        n = len(request_ids)
        need_len = max(starts) + 1
        cap_len = max(128, 1 << (need_len - 1).bit_length())
        cap_slots = -(-n // 16) * 16
        if cap_slots * cap_len * self.bytes_per_token > self.budget_bytes:
            self.reset()
            return None
        self._drop_absent(set(request_ids))
        self._ensure_capacity(cap_slots, cap_len)
        assert self.k is not None and self.v is not None
        where = {rid: i for i, rid in enumerate(self.ids)}
        for idx, rid in enumerate(request_ids):
            slot = where.get(rid)
            if slot is None:
                slot = len(self.ids)
                self.ids.append(rid)
                self.lengths.append(-1)
                where[rid] = slot
            if self.lengths[slot] != starts[idx]:  # new or stale: fill from the paged cache
                self._fill(slot, block_tables[idx], starts[idx])
            self.lengths[slot] = starts[idx] + 1  # the step writes position `start`
        order = [0] * n
        for idx, rid in enumerate(request_ids):
            order[where[rid]] = idx
        return order

    def step_inputs(self, starts_in_slot_order: list[int]) -> MirrorStep:
        assert self.k is not None and self.v is not None
        dev = self.k.device
        pos = torch.tensor(starts_in_slot_order, dtype=torch.long, device=dev)
        max_len = max(starts_in_slot_order) + 1
        mask = (torch.arange(max_len, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
        slots = torch.arange(len(starts_in_slot_order), device=dev)
        return MirrorStep(self.k, self.v, slots, pos, max_len, mask)

    # -- row management --------------------------------------------------------------------------------
    def drop(self, req_ids: set[str]) -> None:
        """Rows of these requests go (the last row moves into each hole)."""
        self._drop_absent(set(self.ids) - req_ids)

    def _drop_absent(self, keep: set[str]) -> None:
        i = 0
        while i < len(self.ids):
            if self.ids[i] in keep:
                i += 1
                continue
            last = len(self.ids) - 1
            if i != last and self.k is not None and self.v is not None:
                n = max(self.lengths[last], 0)
                self.k[:, i, :, :n] = self.k[:, last, :, :n]
                self.v[:, i, :, :n] = self.v[:, last, :, :n]
                self.ids[i], self.lengths[i] = self.ids[last], self.lengths[last]
            self.ids.pop()
            self.lengths.pop()

    def _ensure_capacity(self, slots: int, length: int) -> None:
        old_slots, old_len = self.capacity
        if slots <= old_slots and length <= old_len:
            return
        slots, length = max(slots, old_slots), max(length, old_len)
        shape = (self.num_layers, slots, self.nkv, length, self.hd)
        # zeros, not empty: attention reads whole rows under a mask, and a masked key still multiplies its
        # value by 0 -- recycled memory holding NaN bit patterns would turn that into NaN.
        k = torch.zeros(shape, dtype=self.kv.dtype, device=self.kv.device)
        v = torch.zeros(shape, dtype=self.kv.dtype, device=self.kv.device)
        if self.k is not None and self.v is not None:
            for i, n in enumerate(self.lengths):
                if n > 0:
                    k[:, i, :, :n] = self.k[:, i, :, :n]
                    v[:, i, :, :n] = self.v[:, i, :, :n]
        self.k, self.v = k, v

    def _fill(self, slot: int, block_table: list[int], num_tokens: int) -> None:
        """Copy positions [0, num_tokens) of a request from its blocks into its row, all layers at once."""
        assert self.k is not None and self.v is not None
        if num_tokens == 0:
            return
        nb = -(-num_tokens // self.block_size)
        # a block that left a sliding window (the block manager's LEFT_WINDOW, -1): any block will do, the
        # window masks its keys
        ids = torch.tensor([max(b, 0) for b in block_table[:nb]], dtype=torch.long, device=self.kv.device)
        blocks = torch.index_select(self.kv, 2, ids)  # (2, layers, nb, bs, nkv, hd)
        flat = blocks.reshape(2, self.num_layers, nb * self.block_size, self.nkv, self.hd)[:, :, :num_tokens]
        self.k[:, slot, :, :num_tokens] = flat[0].transpose(1, 2)  # (layers, nkv, n, hd)
        self.v[:, slot, :, :num_tokens] = flat[1].transpose(1, 2)


class MirrorAttentionBackend(PagedAttentionBackend):
    """The paged backend, with decodes reading their K/V from a DecodeMirror's rows; prefills, and any step
    whose decodes do not fit the mirror's budget, take the paged path."""

    name = "decode_mirror"
    multi_token_decode = False  # a mirror row per request: verification stays a prefill chunk

    def __init__(self, block_size: int, device: torch.device, kv: torch.Tensor, budget_bytes: int) -> None:
        """kv: the whole paged cache, (2, layers, num_blocks, block_size, nkv, hd)."""
        super().__init__(block_size, device)
        self.mirror = DecodeMirror(kv, budget_bytes)

    def build_metadata(self, step: AttentionStep) -> AttentionMetadata:
        decodes = step.decodes
        if not decodes:
            self.mirror.reset()
            return self._metadata(step, [], None, None)
        order = self.mirror.plan([s.req_id for s in decodes], [s.start for s in decodes],
                                 [s.block_table for s in decodes])
        if order is None:  # over budget: gather from the blocks this step
            return super().build_metadata(step)
        rows = self.mirror.step_inputs([decodes[i].start for i in order])
        return self._metadata(step, order, None, None, extra=rows)

    def decode_attention(self, out: torch.Tensor, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                         scale: float, window: int = 0, softcap: float = 0.0,
                         sinks: torch.Tensor | None = None) -> None:
        m = meta.extra
        if not isinstance(m, MirrorStep):
            super().decode_attention(out, layer_idx, q, k, v, kv_cache, meta, scale, window, softcap, sinks)
            return
        d = meta.num_decodes
        kb, vb = m.k[layer_idx], m.v[layer_idx]  # (S, nkv, cap, hd)
        kb[m.slots, :, m.positions] = k[:d]  # append this step's token to each row
        vb[m.slots, :, m.positions] = v[:d]
        qd = q[:d].unsqueeze(2)  # (D, nh, 1, hd)
        mask = m.mask
        if window > 0:  # row position p is key p; the decode at `positions` sees (positions - W, positions]
            mask = meta.window_cache.get(("mirror_mask", window))  # type: ignore[assignment]
            if mask is None:
                keys = torch.arange(m.max_len, device=m.positions.device)[None, :]
                mask = m.mask & (keys > m.positions[:, None] - window)[:, None, None, :]
                meta.window_cache[("mirror_mask", window)] = mask
        out[:d] = attend(qd, kb[:d, :, : m.max_len], vb[:d, :, : m.max_len], mask, scale, softcap,
                        sinks=sinks).squeeze(2)

    def release(self, req_ids: set[str]) -> None:
        self.mirror.drop(req_ids)
