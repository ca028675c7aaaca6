"""Gemma (the first generation: gemma-2b / 7b, CodeGemma; HF GemmaForCausalLM, GGUF architecture "gemma"):
the llama decoder with Gemma's pieces.

What differs from llama (models/llama.py, whose layer order, fused qkv_proj / gate_up_proj, NeoX-style
rotary and residual stream it keeps):
  - every norm is Gemma's RMSNorm with the (1 + w) weight (RMSNorm(unit_offset=True); llama.cpp's converter
    stores 1 + w, which the GGUF reader takes off again);
  - a GELU-tanh gated MLP (Gemma 3's module);
  - embeddings times sqrt(hidden) (ModelConfig.embedding_multiplier, set by the config readers, as
    llama.cpp applies it: in fp32);
  - the output layer tied to the embedding; head_dim may differ from hidden / heads (7B: 16 x 256 for 3072).
Gemma 2 and 3 (models/gemma3.py) add norms after each sublayer, soft-caps and sliding windows.
"""

from __future__ import annotations

from torch import nn

from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.norm import RMSNorm
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.gemma3 import Gemma3MLP
from tokenmill.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class GemmaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        super().__init__(cfg, layer_idx, method, mlp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)


class GemmaForCausalLM(LlamaForCausalLM):
    """The `CausalLM` of Gemma (models/interface.py)."""

    decoder_layer = GemmaDecoderLayer
    activations = ("gelu_pytorch_tanh", "gelu_tanh")

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        if not cfg.tie_word_embeddings:
            raise ValueError("gemma with an untied output layer is not supported")
        super().__init__(cfg, method, max_positions)
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        for m in self.modules():  # a missing (1 + w) norm would silently be a scale of 1, not the checkpoint's
            if isinstance(m, RMSNorm):
                m.weight.is_required = True  # type: ignore[attr-defined]

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        return Gemma3MLP(cfg, method)

    def load_extra_weight(self, name: str, tensor: object) -> bool:
        """A tied lm_head in a checkpoint (the embedding is used) as well as llama's extras."""
        return name == "lm_head.weight" or super().load_extra_weight(name, tensor)  # type: ignore[arg-type]
