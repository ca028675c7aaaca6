"""OLMo 2 (HF Olmo2ForCausalLM; GGUF architecture "olmo2"): the llama decoder with its norms moved; OLMo 3
(Olmo3ForCausalLM; GGUF "olmo2" with a sliding window), the same with 3 of every 4 layers windowed and rotated
without the YaRN scaling of its global ones (LlamaForCausalLM.rope_windowed); and EXAONE 4 (Exaone4ForCausalLM;
GGUF "exaone4"), the same layer around llama's attention.

What differs from llama (models/llama.py, whose fused qkv_proj / gate_up_proj, rotary and residual stream it
keeps):
  - no norm before a sublayer; one after each, before the residual add:
        h = x + post_attention_layernorm(attn(x))
        out = h + post_feedforward_layernorm(mlp(h));
  - q and k RMS-normalized over the whole projection (nh * hd and nkv * hd wide, one weight each), not per
    head, before they are split into heads and rotated.
Rotary is NeoX-style in both formats (llama.cpp's converter does not permute q / k for olmo2 or exaone4).

EXAONE 4 keeps OLMo 2's norms after the sublayers, with llama's attention (models/llama.py) and what the config
gives it: per-head q / k norms (Qwen3's, before rotary), and with a sliding window, local layers (3 of 4 by
default) windowed and rotated, global ones neither (NoPE: ModelConfig.nope_layers, as SmolLM3's); without a
window (EXAONE 4.0 1.2B) every layer is global and rotated.

Shapes: T = tokens in the step, D = hidden, nh/nkv = heads, hd = head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryTables, rotate_
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaForCausalLM


class Olmo2Attention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__(cfg, layer_idx, method)
        self.q_norm_full = RMSNorm(self.nh * self.hd, cfg.rms_norm_eps)
        self.k_norm_full = RMSNorm(self.nkv * self.hd, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        """h: (T, D) the residual stream itself -> (T, D)."""
        T = h.shape[0]
        q, k, v = self.qkv_proj(h).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k = self.q_norm_full(q.contiguous()), self.k_norm_full(k.contiguous())  # over the whole projection
        qk = rotate_(torch.cat([q.view(T, self.nh, self.hd), k.view(T, self.nkv, self.hd)], dim=1), rope)
        o = attn.backend.forward(self.layer_idx, qk[:, : self.nh], qk[:, self.nh :], v.reshape(T, self.nkv, self.hd),
                                 attn.kv_caches[self.layer_idx], attn.metadata, self.scale,
                                 sliding_window=self.sliding_window)
        return self.o_proj(o.reshape(T, -1))


class Olmo2DecoderLayer(nn.Module):
    attention: type[nn.Module] = Olmo2Attention  # (cfg, layer index, method) -> (T, D) -> (T, D)

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = self.attention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RotaryTables,
                attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """llama's contract: the stream is x + residual (the first layer: x the embeddings, residual None)
        -> (this layer's normed MLP output, residual)."""
        s = x if residual is None else x + residual
        s = s + self.post_attention_layernorm(self.self_attn(s, rope, attn))
        return self.post_feedforward_layernorm(self.mlp(s)), s


class Olmo2ForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of OLMo 2 (models/interface.py)."""

    decoder_layer = Olmo2DecoderLayer
    # HF's self_attn.q_norm / k_norm (GGUF attn_q_norm / attn_k_norm) are the whole-projection norms; the names
    # differ from llama's per-head q_norm / k_norm (None here) so neither is taken for the other
    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping | {
        "q_norm": ("q_norm_full", None), "k_norm": ("k_norm_full", None),
    }


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    attention = LlamaAttention


class Exaone4ForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of EXAONE 4 (models/interface.py): q_norm / k_norm are llama's per-head ones."""

    decoder_layer = Exaone4DecoderLayer
