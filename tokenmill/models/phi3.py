"""Phi-3 / Phi-3.5 / Phi-4-mini: the llama decoder with fused checkpoint tensors, LongRoPE and partial rotary.

The layers are llama's (models/llama.py): pre-norm RMSNorm, q|k|v and gate|up fused, SiLU-gated MLP. What
is Phi-3's own:
- the checkpoint stores the fused tensors itself: HF `qkv_proj` (q rows, then k, then v) and `gate_up_proj`
  (gate rows, then up), GGUF `attn_qkv` and `ffn_up` (loader/weights.py); they load whole into our
  parameters of the same names. A GGUF with separate attn_q / attn_k / attn_v (llama.cpp accepts both)
  goes through llama's packed mapping. No q/k row permutation: llama.cpp's phi3 rotary is NeoX-style.
- LongRoPE: per-frequency factors, short or long, and an attention factor on cos and sin
  (layers/rotary.py: longrope_factors says which set and why it is picked once, from max_model_len);
  from a GGUF the two sets are the tensors rope_factors_short / rope_factors_long.
- partial rotary (Phi-4-mini: 0.75 of each head): ModelConfig.rotary_dim, which llama's rotary honours.
- a sliding window in the config (Phi-3-mini-4k: 2047) on every layer: llama's attention passes it to
  the backend (ModelConfig.layer_windows), as Mistral's.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenmill.layers.linear import LinearMethod
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaForCausalLM

_ROPE_TYPES = (None, "default", "longrope")


class Phi3ForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of the phi3 family (models/interface.py)."""

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        scaling = cfg.rope_scaling or {}
        kind = scaling.get("rope_type") or scaling.get("type")
        if kind not in _ROPE_TYPES:
            raise ValueError(f"phi3 with rope scaling {kind!r} is not supported (supported: default, longrope)")
        super().__init__(cfg, method, max_positions)
        self._longrope: dict[str, list[float]] = {}  # GGUF's factor tensors: short_factor / long_factor

    def load_extra_weight(self, name: str, tensor: torch.Tensor) -> bool:
        if name in ("rope_factors_short", "rope_factors_long"):
            key = "short_factor" if name == "rope_factors_short" else "long_factor"
            self._longrope[key] = [float(f) for f in tensor.to(torch.float32).flatten()]
            return True
        return super().load_extra_weight(name, tensor)

    def rope_scaling(self) -> dict[str, Any] | None:
        """The config's longrope settings with GGUF's factor tensors folded in (an HF config has the lists)."""
        scaling = self.cfg.rope_scaling
        if scaling is None or scaling.get("rope_type") != "longrope" or "short_factor" in scaling:
            return scaling
        if set(self._longrope) != {"short_factor", "long_factor"}:
            raise ValueError(f"GGUF phi3 longrope needs both rope_factors_short and rope_factors_long, got "
                             f"{sorted(self._longrope) or 'neither'}")
        return scaling | self._longrope
