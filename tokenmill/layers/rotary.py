"""Rotary position embeddings (HF convention: rotate the two halves of each head)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from tokenmill.native import kernels


def inv_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                    rope_freqs: torch.Tensor | None = None) -> torch.Tensor:
    """(head_dim // 2,) inverse frequencies, with llama3 / linear scaling or GGUF's stored factors."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind == "gguf_rope_freqs":
        if rope_freqs is None:
            raise ValueError("GGUF declares rope_freqs but the tensor was not loaded")
        inv = inv / rope_freqs.to(torch.float64)
    elif kind == "linear":
        inv = inv / float(scaling["factor"])  # type: ignore[index]
    elif kind == "llama3":
        assert scaling is not None
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind not in (None, "default"):
        raise ValueError(f"rope scaling {kind!r} is not supported (supported: linear, llama3)")
    return inv.to(torch.float32)


class RotaryTables(NamedTuple):
    """One step's rows of the tables, picked once and shared by every layer."""

    cos: torch.Tensor  # (T, 1, hd)
    signed_sin: torch.Tensor  # (T, 1, hd): sin with rotate-half's sign folded in
    native: bool = False  # rotate_ may use the native kernel


class RotaryEmbedding:
    """cos/sin tables for positions [0, max_positions). Per step, `tables(positions)` picks the rows once
    for all layers; `rotate_` then turns q and k (adjacent heads in one tensor) in one pass per layer."""

    def __init__(self, head_dim: int, max_positions: int, inv_freq: torch.Tensor, device: torch.device,
                 dtype: torch.dtype) -> None:
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (P, hd/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (P, hd)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        # sin with rotate-half's sign folded in: x * cos + roll(x, hd/2) * signed_sin
        #   == x * cos + cat(-x2, x1) * sin  (HF's rotate_half)
        sin = freqs.sin()
        self.signed_sin = torch.cat([-sin, sin], dim=-1).to(device=device, dtype=dtype)
        self.use_native = kernels.is_enabled()  # decided once (TOKENMILL_NATIVE_KERNELS=0: torch)

    def tables(self, positions: torch.Tensor) -> RotaryTables:
        """positions (T,) -> cos, signed sin (T, 1, hd), broadcast over heads."""
        return RotaryTables(torch.index_select(self.cos, 0, positions).unsqueeze(1),
                            torch.index_select(self.signed_sin, 0, positions).unsqueeze(1), self.use_native)


def rotate(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """x (T, heads, hd) -> rotated copy. `tables` from RotaryEmbedding.tables for the same T positions."""
    return x * tables.cos + x.roll(x.shape[-1] // 2, dims=-1) * tables.signed_sin


def rotate_(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """x (T, heads, hd), heads adjacent (a view into the qkv projection is fine) -> rotated: in place by
    the native kernel when it takes the tensors (bit-identical to `rotate` in fp32), else the copy that
    `rotate` makes. Use the returned tensor."""
    if tables.native and kernels.rotary_(x, tables.cos, tables.signed_sin):
        return x
    return rotate(x, tables)
