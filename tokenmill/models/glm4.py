"""GLM-4 (HF Glm4ForCausalLM, the 0414 models; GGUF architecture "glm4"): the llama decoder with a norm before
and after each sublayer, and rotary on half of each head's dims, pairing adjacent ones.

What differs from llama (models/llama.py, whose attention, fused qkv_proj / gate_up_proj and rotary it keeps):
  - sandwich norms, as Gemma 2's but plain RMSNorm (w, not 1 + w):
        h = x + post_self_attn_layernorm(attn(input_layernorm(x)))
        out = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)));
  - partial rotary (partial_rotary_factor, 0.5: ModelConfig.rotary_dim), on adjacent pairs of the rotating
    dims (GPT-J style): the loader reorders those q / k rows into halves, in both formats (llama.cpp keeps
    HF's rows; loader/weights.py, INTERLEAVED_ROTARY), so llama's rotary computes it;
  - q / k / v biases (attention_bias), none on o_proj; the checkpoint's MLP is one gate_up_proj tensor.

Decode steps on the gguf method run in one native call (models/native_decode.py: the sandwich norms as Gemma's).

Shapes: T = tokens in the step, D = hidden.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryTables
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaForCausalLM


class Glm4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = LlamaAttention(cfg, layer_idx, method)
        self.post_self_attn_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)  # before the MLP (HF's name)
        self.mlp = mlp
        self.post_mlp_layernorm = RMSNorm(d, eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RotaryTables,
                attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """llama's contract: the stream is x + residual (the first layer: x the embeddings, residual None)
        -> (this layer's normed MLP output, residual)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:  # the stream's sum and its norm in one pass (native: the step's bits)
            h, residual = self.input_layernorm(x, residual)
        a = self.post_self_attn_layernorm(self.self_attn(h, rope, attn))
        h, residual = self.post_attention_layernorm(a, residual)
        return self.post_mlp_layernorm(self.mlp(h)), residual


class Glm4ForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of GLM-4 (models/interface.py)."""

    decoder_layer = Glm4DecoderLayer
