"""Rotary position embeddings (HF convention: rotate the two halves of the rotating part of each head).

A head of hd dims rotates its first `dim` of them (dim == hd unless the config asks for partial rotary,
e.g. Phi-4-mini's 0.75); the rest pass through unchanged. The tables are (P, dim) wide."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from tokenmill.native import kernels


def inv_frequencies(dim: int, theta: float, scaling: dict[str, Any] | None,
                    rope_freqs: torch.Tensor | None = None, max_positions: int = 0) -> torch.Tensor:
    """(dim // 2,) inverse frequencies for the `dim` rotating dims of a head, with llama3 / linear /
    longrope scaling or GGUF's stored factors. `max_positions` (the context the tables cover) picks
    longrope's factor set (longrope_factors)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind == "longrope":
        assert scaling is not None
        factors = torch.tensor(longrope_factors(scaling, max_positions), dtype=torch.float64)
        if factors.shape != inv.shape:
            raise ValueError(f"longrope has {factors.numel()} factors, the rotary needs {inv.numel()} (dim {dim} / 2)")
        inv = inv / factors
    elif kind == "gguf_rope_freqs":
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
    elif kind == "yarn":
        assert scaling is not None
        inv = yarn_inv_frequencies(inv, dim, theta, scaling)
    elif kind not in (None, "default"):
        raise ValueError(f"rope scaling {kind!r} is not supported (supported: linear, llama3, longrope, yarn)")
    return inv.to(torch.float32)


def yarn_inv_frequencies(inv: torch.Tensor, dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """YaRN (Qwen2.5 / Qwen3 long-context configs, and GGUFs converted from them): each frequency is a blend
    of itself (extrapolated: the fast ones, which turn many times within the original context) and itself
    divided by `factor` (interpolated: the slow ones). Frequency i turns orig / (2 pi) * inv[i] times over
    the original context; the blend weight runs linearly in i from the index where that is beta_fast turns
    (weight 1: kept as is) to where it is beta_slow (weight 0: divided), the two indices rounded outwards
    (down and up; `truncate`: false keeps them exact). Static: the same tables at every length, as in
    transformers, vLLM and llama.cpp. `inv`: the plain (dim // 2,) float64 frequencies."""
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings")
    if not factor or not original:
        raise ValueError("yarn rope scaling needs factor and original_max_position_embeddings")
    fast, slow = float(scaling.get("beta_fast") or 32.0), float(scaling.get("beta_slow") or 1.0)

    def index_at(turns: float) -> float:  # the (fractional) frequency index that turns `turns` times
        return dim * math.log(float(original) / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = index_at(fast), index_at(slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if hi == lo:
        hi += 0.001
    keep = 1.0 - ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0.0, 1.0)
    return inv / float(factor) * (1.0 - keep) + inv * keep


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def longrope_factors(scaling: dict[str, Any], max_positions: int) -> list[float]:
    """LongRoPE (Phi-3): each frequency is divided by a factor, from `long_factor` when the context exceeds
    `original_max_position_embeddings`, else from `short_factor`.

    transformers picks by the length of the sequence so far, so a sequence that crosses the threshold
    changes the rotary of every earlier position too (its generate() then recomputes the whole cache). A
    paged KV cache shared across requests cannot do that, so the set is picked once from the context the
    engine serves (max_model_len), as vLLM does (use_long_rope = max_model_len > original) and llama.cpp
    does (n_ctx_per_seq > n_ctx_orig). Both agree with transformers whenever max_model_len <= original
    (short for every sequence) or the sequence is longer than original (long); they differ for a short
    sequence under a long max_model_len, where transformers uses short factors and we use long ones."""
    original = int(scaling["original_max_position_embeddings"])
    key = "long_factor" if max_positions > original else "short_factor"
    return [float(f) for f in scaling[key]]


def attention_factor(scaling: dict[str, Any] | None, max_position_embeddings: int) -> float:
    """What cos and sin are multiplied by: 1.0, except for longrope and yarn, where it is the config's
    `attention_factor`, else as transformers computes it: for longrope sqrt(1 + ln(s) / ln(original)) for
    the scale s = `factor`, or max_position_embeddings / original_max_position_embeddings without one (1.0
    if s <= 1); for yarn 1 + 0.1 ln(factor) (YaRN's temperature), or with DeepSeek's mscale and
    mscale_all_dim the ratio of that at each."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind not in ("longrope", "yarn"):
        return 1.0
    assert scaling is not None
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    if kind == "yarn":
        factor = float(scaling["factor"])
        mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and all_dim:
            return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(all_dim))
        return _yarn_mscale(factor)
    original = int(scaling["original_max_position_embeddings"])
    s = float(scaling.get("factor") or max_position_embeddings / original)
    return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(original))


class RotaryTables(NamedTuple):
    """One step's rows of the tables, picked once and shared by every layer."""

    cos: torch.Tensor  # (T, 1, dim), dim <= hd the rotating dims
    signed_sin: torch.Tensor  # (T, 1, dim): sin with rotate-half's sign folded in
    native: bool = False  # rotate_ may use the native kernel
    # (T, 1, 1) what each row's rotated q is multiplied by (Ministral 3's attention temperature), or None: 1
    q_scale: torch.Tensor | None = None


class RotaryEmbedding:
    """cos/sin tables for positions [0, max_positions), (P, dim) with dim = 2 * len(inv_freq) the rotating
    dims of a head. Per step, `tables(positions)` picks the rows once for all layers; `rotate_` then turns
    q and k (adjacent heads in one tensor) in one pass per layer. `scale` multiplies cos and sin (longrope's
    attention factor; 1.0 otherwise)."""

    def __init__(self, head_dim: int, max_positions: int, inv_freq: torch.Tensor, device: torch.device,
                 dtype: torch.dtype, scale: float = 1.0) -> None:
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (P, dim/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (P, dim)
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        # sin with rotate-half's sign folded in: x * cos + roll(x, dim/2) * signed_sin
        #   == x * cos + cat(-x2, x1) * sin  (HF's rotate_half)
        sin = freqs.sin() * scale
        self.signed_sin = torch.cat([-sin, sin], dim=-1).to(device=device, dtype=dtype)
        self.use_native = kernels.is_enabled()  # decided once (TOKENMILL_NATIVE_KERNELS=0: torch)

    def tables(self, positions: torch.Tensor) -> RotaryTables:
        """positions (T,) -> cos, signed sin (T, 1, dim), broadcast over heads."""
        return RotaryTables(torch.index_select(self.cos, 0, positions).unsqueeze(1),
                            torch.index_select(self.signed_sin, 0, positions).unsqueeze(1), self.use_native)


def _rotated(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """x (T, heads, dim), dim the tables' width -> rotated copy."""
    return x * tables.cos + x.roll(x.shape[-1] // 2, dims=-1) * tables.signed_sin


def rotate(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """x (T, heads, hd) -> rotated copy: the first dim (the tables' width) dims of each head rotate, the
    rest pass through. `tables` from RotaryEmbedding.tables for the same T positions."""
    dim = tables.cos.shape[-1]
    if dim == x.shape[-1]:
        return _rotated(x, tables)
    return torch.cat([_rotated(x[..., :dim], tables), x[..., dim:]], dim=-1)


def rotate_(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """x (T, heads, hd), heads adjacent (a view into the qkv projection is fine) -> rotated: in place by
    the native kernel when it takes the tensors (bit-identical to `rotate` in fp32), else the copy that
    `rotate` makes; partial rotary (tables narrower than hd) rotates the leading dims in place (the kernel, else
    torch). Use the returned tensor."""
    dim = tables.cos.shape[-1]
    if tables.native and kernels.rotary_(x, tables.cos, tables.signed_sin):
        return x
    if dim == x.shape[-1]:
        return _rotated(x, tables)
    part = x[..., :dim]
    part.copy_(_rotated(part, tables))  # the right side is a new tensor: no aliasing
    return x
