"""Gemma 3 text decoder (HF Gemma3ForCausalLM, model_type gemma3_text; GGUF architecture "gemma3"), and Gemma 2
(HF Gemma2ForCausalLM; GGUF "gemma2"): the same layer without the per-head q/k norms, with the attention
scores soft-capped (attn_logit_softcapping: cap * tanh(s / cap) before the softmax), local and global layers
alternating, one rotary base for both (ModelConfig's gemma2 readers set these).

What differs from llama (models/llama.py, whose fused qkv_proj / gate_up_proj and residual stream it
follows):
  - local layers attend over a sliding window (ModelConfig.layer_windows: 5 local, then 1 global, unless
    the config says otherwise); local layers rotate with their own base (rope_local_theta, 10000), global
    ones with rope_theta and the config's rope scaling;
  - every norm is Gemma's RMSNorm with the (1 + w) weight (RMSNorm(unit_offset=True));
  - per-head q and k RMSNorms before rotary (HeadRMSNorm, Qwen3's, with weight_offset 1); attention scale
    query_pre_attn_scalar ** -0.5;
  - norms before *and after* each sublayer:
        h = x + post_attention_layernorm(attn(input_layernorm(x)))
        out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
  - a GELU-tanh gated MLP; embeddings scaled by sqrt(hidden) (the scale rounded to the model's dtype, as
    HF does); the output layer tied to the embedding; logits soft-capped when final_logit_softcapping is set.

Decode steps on the gguf method run in one native call (models/native_decode.py), the same kernels as these
layers: the GELU-tanh and (1 + w) q/k norms on native kernels, the local layers' tables as the step's second ones.

Shapes: T = tokens in the step, D = hidden, nh/nkv = heads, hd = head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.activation import GeluTanhAndMul
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.head_norm import HeadRMSNorm
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.mlp import GatedMLP
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryEmbedding, RotaryTables, attention_factor, inv_frequencies
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention
from tokenmill.models.native_decode import NativeDecode, decide

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


class Gemma3Attention(LlamaAttention):
    """Llama's attention (its forward: q/k norms in place, rotary, the backend) with Gemma's q/k norms (Gemma 3),
    scale and soft-cap (Gemma 2)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__(cfg, layer_idx, method)
        self.layer_idx = layer_idx
        self.sliding_window = cfg.layer_windows()[layer_idx]  # 0: a global layer
        self.rotates, self.norm_after_rotary = True, False
        gemma3 = cfg.architecture == "gemma3"  # Gemma 2 has no q/k norms
        self.q_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps, weight_offset=1.0) if gemma3 else None
        self.k_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps, weight_offset=1.0) if gemma3 else None
        self.scale = (cfg.query_pre_attn_scalar or self.hd) ** -0.5
        self.softcap = cfg.attn_logit_softcapping  # Gemma 2's; 0: none


class Gemma3MLP(GatedMLP):
    """down(gelu_tanh(gate(h)) * up(h))."""

    def __init__(self, cfg: ModelConfig, method: LinearMethod) -> None:
        super().__init__(cfg.hidden_size, cfg.intermediate_size, method, act=GeluTanhAndMul())


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.is_local = cfg.layer_windows()[layer_idx] > 0
        self.input_layernorm = RMSNorm(d, eps, unit_offset=True)
        self.self_attn = Gemma3Attention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(d, eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(d, eps, unit_offset=True)
        self.mlp = Gemma3MLP(cfg, method)
        self.post_feedforward_layernorm = RMSNorm(d, eps, unit_offset=True)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope_local: RotaryTables,
                rope_global: RotaryTables, attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream as (x, residual), as in llama: the stream is x + residual (the first layer:
        x the embeddings, residual None). -> (this layer's normed MLP output, residual), (T, D) each."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        a = self.post_attention_layernorm(self.self_attn(h, rope_local if self.is_local else rope_global, attn))
        h, residual = self.pre_feedforward_layernorm(a, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, method: LinearMethod) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, method)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i, method) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)


class Gemma3ForCausalLM(nn.Module):
    """The `CausalLM` of Gemma 3's text model, and of Gemma 2 (models/interface.py)."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        super().__init__()
        if cfg.hidden_act not in _GELU_TANH:
            raise ValueError(f"{cfg.architecture} with hidden activation {cfg.hidden_act!r} is not supported "
                             f"(supported: {', '.join(_GELU_TANH)})")
        if not cfg.tie_word_embeddings:
            raise ValueError(f"{cfg.architecture} with an untied output layer is not supported")
        self.cfg = cfg
        self.max_positions = max_positions
        self.model = Gemma3Model(cfg, method)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, method)
        self.lm_head.wide_out = True  # fp32 logits where the kernel gives them (layers/linear.py)
        self.lm_head.weight.data = torch.empty(0)  # tied: filled from the embedding at finish_loading
        self.lm_head.weight.is_required = False  # type: ignore[attr-defined]
        # HF's embed_scale buffer is not saved; norms must be in the checkpoint (a missing (1 + w) norm would
        # silently be a scale of 1, not HF's default)
        self.rope_local: RotaryEmbedding | None = None
        self.rope_global: RotaryEmbedding | None = None
        self.embed_scale = cfg.hidden_size ** 0.5
        self.native_decode: NativeDecode | None = None  # decode steps in one native call (finish_loading)

    # -- weights ---------------------------------------------------------------------------------------
    def load_extra_weight(self, name: str, tensor: torch.Tensor) -> bool:
        """HF's stored rotary inv_freq (recomputed) and a tied lm_head (the embedding is used). True if taken."""
        return "rotary_emb" in name or name == "lm_head.weight"

    def finish_loading(self, device: torch.device, dtype: torch.dtype) -> None:
        self.to(device=device, dtype=dtype)
        embed = self.model.embed_tokens
        if embed.blocks is not None:  # the head multiplies by the embedding's blocks
            self.lm_head.weight.weight_loader(self.lm_head.weight, embed.blocks, None)  # type: ignore[attr-defined]
        else:
            self.lm_head.weight.data = embed.weight.data
        for m in self.modules():
            if isinstance(m, Linear):
                m.finish_loading()
        if embed.blocks is not None:  # gather from the head's blocks if it packed them
            embed.share_packed_head(self.lm_head)
        hd = self.cfg.head_dim
        self.rope_global = RotaryEmbedding(hd, self.max_positions,
                                           inv_frequencies(hd, self.cfg.rope_theta, self.cfg.rope_scaling),
                                           device, dtype,
                                           attention_factor(self.cfg.rope_scaling, self.cfg.max_position_embeddings))
        self.rope_local = RotaryEmbedding(hd, self.max_positions,
                                          inv_frequencies(hd, self.cfg.rope_local_theta or 10_000.0, None),
                                          device, dtype)
        if device.type == "cpu":
            self.native_decode = decide(self)

    def native_rotary(self) -> tuple[RotaryEmbedding | None, RotaryEmbedding | None]:
        """(the global layers' tables, the local (windowed) layers') for the native decode step."""
        return self.rope_global, self.rope_local

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) -> (T, D) the scaled embeddings: HF scales by sqrt(hidden) rounded to the weights' dtype."""
        x = self.model.embed_tokens(input_ids)
        return x * torch.tensor(self.embed_scale, dtype=x.dtype)

    # -- compute ---------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """input_ids, positions: (T,) -> final hidden states (T, D). `num_layers`: run only the first
        that many layers, then the final norm (layer-skip drafting)."""
        assert self.rope_local is not None and self.rope_global is not None, "call finish_loading() first"
        if self.native_decode is not None:
            hidden = self.native_decode.forward(input_ids, positions, attn, num_layers)
            if hidden is not None:
                return hidden
        x = self.embed(input_ids)
        rope_local, rope_global = self.rope_local.tables(positions), self.rope_global.tables(positions)
        residual: torch.Tensor | None = None
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]
        for layer in layers:
            x, residual = layer(x, residual, rope_local, rope_global, attn)
        if residual is None:
            return self.model.norm(x)
        return self.model.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """(S, D) -> (S, V) float32 logits, soft-capped (cap * tanh(logits / cap)) when the config says so
        (then always float32: the ties are those of the capped float32 values); without a cap float32=False
        leaves them in the head's dtype."""
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcapping
        if not cap:
            return logits.float() if float32 else logits
        logits = logits.float()
        return torch.tanh(logits / cap) * cap
