"""Rotary position embeddings (HF convention: rotate the two halves of each head)."""

from __future__ import annotations

import math
from typing import Any

import torch


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


class RotaryEmbedding:
    """cos/sin tables for positions [0, max_positions). Per step, `tables(positions)` picks the rows once
    for all layers; `rotate` then turns q and k (adjacent heads in one tensor) in one pass per layer."""

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

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) -> cos, signed sin (T, 1, hd), broadcast over heads."""
        return (torch.index_select(self.cos, 0, positions).unsqueeze(1),
                torch.index_select(self.signed_sin, 0, positions).unsqueeze(1))


def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (T, heads, hd) -> rotated copy. `tables` from RotaryEmbedding.tables for the same T positions."""
    cos, signed_sin = tables
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
