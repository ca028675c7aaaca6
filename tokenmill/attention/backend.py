"""The attention backend interface: metadata built once per step, a forward per layer, release per request.

The runner describes a step as plain lists (`AttentionStep`: which sequences decode one token and which
run a prefill chunk, where they start, their block tables); the backend turns that into its metadata
once, and every layer then calls `forward` with it. A backend may reorder the decodes (the decode
mirror wants them in its row order); it says how in `AttentionMetadata.decode_order`, and the runner
lays out the step's tokens in that order.

KV cache per layer: (k_cache, v_cache), each (num_blocks, block_size, num_kv_heads, head_dim).

Sliding window: a layer may attend over a window of W keys (Mistral's, Gemma's local layers): the query
at position p sees keys in (p - W, p] (HF's and llama.cpp's rule), W == 0 meaning all of [0, p]. The
window is a per-layer argument of `forward`; what a backend derives from it per step (masks, first key
positions) it keeps in `AttentionMetadata.window_cache`, built by the first layer that asks. Blocks wholly
before a window are never read: with every layer windowed the block manager frees them, so a block table
may hold -1 or another request's block there.

Attention sinks (gpt-oss): a learned logit per query head joins each softmax and takes its share of the
weight without contributing a value: out = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ScheduledSeq:
    """One request's tokens in a step: positions [start, start + num_tokens)."""

    req_id: str
    start: int  # == tokens of the request already in the cache
    num_tokens: int
    block_table: list[int]  # with a window on every layer, -1 (LEFT_WINDOW) may stand before the window


@dataclass
class AttentionStep:
    decodes: list[ScheduledSeq]  # one token each, start > 0
    prefills: list[ScheduledSeq]  # chunks of prompts (or of recomputation)


@dataclass
class PrefillChunk:
    q_start: int  # offset of the chunk's first token in the step's token axis
    q_len: int
    start: int  # position of the chunk's first token (== tokens already in the cache)
    block_table: torch.Tensor  # (num_blocks_of_request,) int64, on device


@dataclass
class AttentionMetadata:
    """Built once per step by the backend and passed to every layer (never a global). Token order in the
    step: decodes first (in `decode_order`), then the prefill chunks in the order given."""

    slot_mapping: torch.Tensor  # (T,) int64: cache slot of each new token
    num_decodes: int  # the first num_decodes tokens are decodes
    decode_block_tables: torch.Tensor | None  # (D, max_blocks) int64, padded with 0
    decode_mask: torch.Tensor | None  # (D, 1, 1, max_blocks * bs) bool: True where the key is valid
    prefills: list[PrefillChunk]
    decode_context_lens: torch.Tensor | None = None  # (D,) int64: keys each decode attends to (start + 1)
    decode_order: list[int] = field(default_factory=list)  # i-th decode token = step.decodes[order[i]]
    extra: object | None = None  # backend-specific per-step state (the decode mirror's rows)
    window_cache: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (what, W) -> tensor


@dataclass
class AttentionContext:
    """What a model's forward needs for attention, passed explicitly: the backend, this step's
    metadata, and the per-layer caches."""

    backend: AttentionBackend
    metadata: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # by KV layer (ModelConfig.kv_layers' order)
    # a model with recurrent layers: the step's sequences and their states (worker/recurrent_state.py's
    # RecurrentStep); None: every sequence of the step starts at position 0 and keeps no state
    recurrent: Any = None


class AttentionBackend(ABC):
    name: str
    # True: a request may stand in one step as several decode entries at consecutive positions (speculative
    # verification: its last token and its drafts), kept in the order given; every token's K/V is written
    # before any token attends
    multi_token_decode: bool = False

    @abstractmethod
    def build_metadata(self, step: AttentionStep) -> AttentionMetadata:
        """Once per step, before the forward."""

    @abstractmethod
    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, scale: float,
                sliding_window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q (T, nh, hd), k and v (T, nkv, hd) of this step's tokens: write k, v to their cache slots, then
        attend (over the last `sliding_window` keys of each query when > 0; each score s soft-capped to
        softcap * tanh(s / softcap) when softcap > 0; with `sinks` (nh,), one more logit per query head in
        each softmax's denominator that selects no value, gpt-oss's attention sinks). Returns (T, nh, hd)."""

    def release(self, req_ids: set[str]) -> None:
        """These requests are finished: drop any state kept for them."""
