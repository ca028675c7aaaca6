"""Cohere2 (Command R7B; HF Cohere2ForCausalLM, GGUF architecture "cohere2"): one LayerNorm (no bias) per layer
feeding attention and the MLP side by side, llama's attention and MLP otherwise.

What differs from llama (models/llama.py):
  - parallel sublayers from one norm: out = x + attn(norm(x)) + mlp(norm(x)); LayerNorm (mean taken out, a
    scale, no bias), also the final one;
  - with a sliding window, 3 of 4 layers windowed and rotated, every 4th global without rotary (ModelConfig's
    layer_types and nope_layers);
  - rotary on adjacent pairs of dims (the loader reorders q / k rows into halves: loader/weights.py,
    INTERLEAVED_ROTARY; llama.cpp keeps HF's rows);
  - logits times logit_scale (ModelConfig.logits_scaling = 1 / logit_scale), the head tied.

Decode steps on the gguf method run in one native call (models/native_decode.py), the norms on the LayerNorm kernel
both paths call.

Shapes: T = tokens in the step, D = hidden.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.norm import LayerNorm
from tokenmill.layers.rotary import RotaryTables
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaForCausalLM


class Cohere2DecoderLayer(nn.Module):
    parallel_mlp = True  # the MLP reads the attention's input; the layer's output is their sum (the native step's)
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_idx, method)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RotaryTables,
                attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """llama's contract: the stream is x + residual (the first layer: x the embeddings, residual None)
        -> (attention's + the MLP's output, residual)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        return self.self_attn(h, rope, attn) + self.mlp(h), residual


class Cohere2ForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of Cohere2 (models/interface.py)."""

    decoder_layer = Cohere2DecoderLayer

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        super().__init__(cfg, method, max_positions)
        self.model.norm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)  # type: ignore[assignment]
