"""Llama-family decoder (Llama 2/3, SmolLM, SmolLM3, Mistral, Qwen2, Qwen3, Granite), device-free, with fused
QKV and gate/up.

Qwen3 is Llama with `cfg.qk_norm`: each q and k head RMS-normalized (its own weight) before rotary (after it
with `cfg.qk_norm_after_rotary`: Hunyuan, models/hunyuan.py).
SmolLM3 is Llama with `cfg.nope_layers`: those layers' q and k are not rotated (every 4th layer).
Ministral 3 is Llama with an attention temperature (ModelConfig.attn_temperature_scale): each row's q, after
rotary, times 1 + beta ln(1 + floor(pos / original context)), 1 inside the original context.
OLMo 3 (models/olmo2.py) rotates its windowed layers with their own tables (rope_windowed: no YaRN there).
Granite is Llama with four multipliers (ModelConfig): embeddings scaled, attention scaled by
attention_multiplier instead of head_dim ** -0.5, each sublayer's output scaled before it joins the
residual stream, logits divided by logits_scaling.

Parameter names follow the HF checkpoints, with q/k/v fused into `qkv_proj` and gate/up into
`gate_up_proj` (`packed_modules_mapping` tells the loader which checkpoint tensor goes into which rows).

Shapes: T = tokens in the step (all requests, flattened), D = hidden, nh/nkv = heads, hd = head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.embedding import VocabEmbedding
from tokenmill.layers.head_norm import HeadRMSNorm
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.mlp import GatedMLP
from tokenmill.layers.moe import SparseMoE
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryEmbedding, RotaryTables, attention_factor, inv_frequencies, rotate_
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.native_decode import NativeDecode, decide


class LlamaAttention(nn.Module):
    output_gate = False  # Qwen3.5's: q's rows carry a gate per head, the output times its sigmoid

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__()
        self.layer_idx = cfg.kv_layers.index(layer_idx)  # its layer in the KV cache (== layer_idx without recurrent layers)
        self.sliding_window = cfg.layer_windows()[layer_idx]  # Mistral's and Phi-3's window (0: none)
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, kv, d = self.nh * self.hd, self.nkv * self.hd, cfg.hidden_size
        self.qkv_proj = Linear(d, q + 2 * kv, method, bias=cfg.attention_bias, shards={"q": q, "k": kv, "v": kv})
        self.o_proj = Linear(q, d, method)
        self.scale = cfg.attention_multiplier or self.hd ** -0.5
        self.rotates = layer_idx not in cfg.nope_layers
        self.q_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.norm_after_rotary = cfg.qk_norm_after_rotary
        self.sinks: torch.Tensor | None = None  # (nh,) gpt-oss's attention sinks (models/gpt_oss.py); None: none
        self.softcap = 0.0  # scores capped at softcap * tanh(s / softcap) before the softmax (Gemma 2's); 0: none

    def forward(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        """h: (T, D) normed hidden -> (T, D)."""
        T = h.shape[0]
        qkv = self.qkv_proj(h)  # (T, (nh + 2 nkv) hd)
        qk, v = qkv.split([(self.nh + self.nkv) * self.hd, self.nkv * self.hd], dim=-1)
        qk = qk.view(T, self.nh + self.nkv, self.hd)
        if not self.norm_after_rotary:
            qk = self._norm_qk(qk)
        if self.rotates:
            qk = rotate_(qk, rope)  # q and k heads are adjacent: one pass
        if self.norm_after_rotary:  # Hunyuan's order
            qk = self._norm_qk(qk)
        q, k = qk[:, : self.nh], qk[:, self.nh :]
        if rope.q_scale is not None:  # Ministral 3's temperature, after rotary
            q = q * rope.q_scale.to(q.dtype)
        v = v.view(T, self.nkv, self.hd)
        o = attn.backend.forward(self.layer_idx, q, k, v, attn.kv_caches[self.layer_idx], attn.metadata, self.scale,
                                 sliding_window=self.sliding_window, softcap=self.softcap, sinks=self.sinks)
        return self.o_proj(o.reshape(T, -1))


    def _norm_qk(self, qk: torch.Tensor) -> torch.Tensor:
        """(T, nh + nkv, hd) -> each q and k head RMS-normalized by its norm (as it is without them)."""
        if self.q_norm is None or self.k_norm is None:
            return qk
        if self.q_norm.normalize_(qk[:, : self.nh]):  # in place, on the native kernel
            if self.k_norm.normalize_(qk[:, self.nh :]):
                return qk
            return torch.cat([qk[:, : self.nh], self.k_norm(qk[:, self.nh :])], dim=1)
        return torch.cat([self.q_norm(qk[:, : self.nh]), self.k_norm(qk[:, self.nh :])], dim=1)


class LlamaMLP(GatedMLP):
    def __init__(self, cfg: ModelConfig, method: LinearMethod) -> None:
        super().__init__(cfg.hidden_size, cfg.intermediate_size, method)


class LlamaDecoderLayer(nn.Module):
    attention: type[nn.Module] = LlamaAttention  # (cfg, layer index, method) -> (T, D) normed -> (T, D)

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = self.attention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp  # (T, D) -> (T, D): LlamaMLP, or a mixture of experts (models/moe.py)
        self.residual_multiplier = cfg.residual_multiplier  # Granite's; 1.0 elsewhere

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RotaryTables,
                attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream, carried as (x, residual): the stream is x + residual, x the previous
        sublayer's output (the first layer: x the embeddings, residual None). Each norm adds x into the
        residual and normalizes the sum in one pass. -> (this layer's MLP output, residual), (T, D) each."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        m = self.residual_multiplier
        a = self.self_attn(h, rope, attn)
        h, residual = self.post_attention_layernorm(a if m == 1.0 else a.mul_(m), residual)
        out = self.mlp(h)
        return (out if m == 1.0 else out.mul_(m)), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, method: LinearMethod, mlps: list[nn.Module],
                 layer_cls: type[nn.Module] = LlamaDecoderLayer) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, method)
        self.layers = nn.ModuleList(layer_cls(cfg, i, method, mlps[i]) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The `CausalLM` of the llama family (models/interface.py)."""

    # checkpoint module name -> (our fused module, its shard)
    packed_modules_mapping: dict[str, tuple[str, str | None]] = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
    }

    # the decoder layer: (cfg, layer index, method, mlp) -> a module with llama's forward contract
    decoder_layer: type[nn.Module] = LlamaDecoderLayer
    activations: tuple[str, ...] = ("silu",)  # the MLP's gate activations this family's make_mlp computes

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        super().__init__()
        if cfg.hidden_act not in self.activations:
            raise ValueError(f"{cfg.architecture} with hidden_act {cfg.hidden_act!r} is not supported (supported: "
                             f"{', '.join(self.activations)})")
        self.cfg = cfg
        self.max_positions = max_positions
        self.model = LlamaModel(cfg, method, [self.make_mlp(cfg, method, i) for i in range(cfg.num_layers)],
                                self.decoder_layer)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, method)
        self.lm_head.wide_out = True  # fp32 logits where the kernel gives them (layers/linear.py)
        if cfg.tie_word_embeddings:  # filled from the embedding at finish_loading; nothing to allocate now
            self.lm_head.weight.data = torch.empty(0)
            self.lm_head.weight.is_required = False  # type: ignore[attr-defined]
        for m in self.model.layers.modules():  # norms default to ones, as before; matmul weights must be there
            if isinstance(m, RMSNorm):
                m.weight.is_required = False  # type: ignore[attr-defined]
        self.rope: RotaryEmbedding | None = None
        # the windowed layers' own tables where they differ (OLMo 3: plain rotary there, YaRN on the others)
        self.rope_windowed: RotaryEmbedding | None = None
        self.native_decode: NativeDecode | None = None  # decode steps in one native call (finish_loading)
        self._rope_freqs: torch.Tensor | None = None

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        """Layer `layer_idx`'s feed-forward block; a subclass may return another (T, D) -> (T, D) module."""
        return LlamaMLP(cfg, method)

    # -- weights ---------------------------------------------------------------------------------------
    def load_extra_weight(self, name: str, tensor: torch.Tensor) -> bool:
        """Checkpoint tensors that are not parameters: GGUF's rope_freqs (kept for the rotary tables) and
        HF's stored rotary inv_freq (recomputed). True if taken."""
        if name == "rope_freqs":
            self._rope_freqs = tensor.to(torch.float32)
            return True
        return "rotary_emb" in name

    def finish_loading(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move to device/dtype, then let each linear method convert its weights (prepack, quantize)."""
        self.to(device=device, dtype=dtype)
        embed = self.model.embed_tokens
        if self.cfg.tie_word_embeddings and embed.blocks is not None:  # the head multiplies by the same blocks
            self.lm_head.weight.weight_loader(self.lm_head.weight, embed.blocks, None)  # type: ignore[attr-defined]
        elif self.cfg.tie_word_embeddings:  # shared, until a method that converts weights makes its own copy
            self.lm_head.weight.data = embed.weight.data
        for m in self.modules():
            if isinstance(m, SparseMoE):
                m.mark_experts()
        for m in self.modules():
            if isinstance(m, Linear):
                m.finish_loading()
        if self.cfg.tie_word_embeddings and embed.blocks is not None:  # gather from the head's blocks if it packed them
            embed.share_packed_head(self.lm_head)
        self.rope = self.make_rotary(device, dtype)
        self.rope_windowed = self.make_windowed_rotary(device, dtype)
        self.finish_native_layers()
        if device.type == "cpu":
            self.native_decode = decide(self)

    def finish_native_layers(self) -> None:
        """After the cast: a family's layers make what their native kernels read (before the native decode step
        is decided). Llama's layers have nothing to make."""

    def native_rotary(self) -> tuple[RotaryEmbedding | None, RotaryEmbedding | None]:
        """(the tables, the windowed layers' own or None) for the native decode step."""
        return self.rope, self.rope_windowed

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) -> (T, D) the embeddings, scaled where the config says (Granite's multiplier, Gemma's sqrt(D))."""
        x = self.model.embed_tokens(input_ids)
        return x * self.cfg.embedding_multiplier if self.cfg.embedding_multiplier != 1.0 else x

    def rope_scaling(self) -> dict[str, Any] | None:
        """The rope scaling the tables are built with: the config's (a family may complete it from
        checkpoint tensors)."""
        return self.cfg.rope_scaling

    def make_rotary(self, device: torch.device, dtype: torch.dtype) -> RotaryEmbedding:
        """cos/sin tables over the config's rotating dims (all of head_dim unless partial), its scaling,
        for positions [0, max_positions)."""
        cfg, scaling = self.cfg, self.rope_scaling()
        dim = cfg.rotary_dim or cfg.head_dim
        inv = inv_frequencies(dim, cfg.rope_theta, scaling, self._rope_freqs, self.max_positions)
        return RotaryEmbedding(dim, self.max_positions, inv, device, dtype,
                               attention_factor(scaling, cfg.max_position_embeddings))

    def make_windowed_rotary(self, device: torch.device, dtype: torch.dtype) -> RotaryEmbedding | None:
        """The windowed layers' tables where the config gives them their own base (rope_local_theta: that base,
        no scaling, as OLMo 3's sliding layers have); None where they rotate as the others do."""
        cfg = self.cfg
        if not cfg.rope_local_theta or not any(cfg.layer_windows()):
            return None
        if cfg.rope_local_theta == cfg.rope_theta and not self.rope_scaling():
            return None
        dim = cfg.rotary_dim or cfg.head_dim
        return RotaryEmbedding(dim, self.max_positions, inv_frequencies(dim, cfg.rope_local_theta, None), device,
                               dtype)

    # -- compute ---------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """input_ids, positions: (T,) -> final hidden states (T, D). `num_layers`: run only the first
        that many layers, then the final norm (layer-skip drafting)."""
        assert self.rope is not None, "call finish_loading() first"
        if self.native_decode is not None:
            hidden = self.native_decode.forward(input_ids, positions, attn, num_layers)
            if hidden is not None:
                return hidden
        x = self.embed(input_ids)
        rope = self.rope.tables(positions)  # (T, 1, hd) cos / sin rows, shared by every layer
        if self.cfg.attn_temperature_scale:  # Ministral 3: q *= 1 + beta ln(1 + floor(pos / length)), (T, 1, 1)
            steps = torch.floor(positions.to(torch.float32) / self.cfg.attn_temperature_length)
            rope = rope._replace(q_scale=(1 + self.cfg.attn_temperature_scale * torch.log1p(steps)).view(-1, 1, 1))
        residual: torch.Tensor | None = None
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]
        if self.rope_windowed is None:
            for layer in layers:
                x, residual = layer(x, residual, rope, attn)
        else:  # windowed layers on their own tables
            windowed, windows = self.rope_windowed.tables(positions), self.cfg.layer_windows()
            for layer, w in zip(layers, windows):
                x, residual = layer(x, residual, windowed if w else rope, attn)
        if residual is None:  # no layers
            return self.model.norm(x)
        return self.model.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """(S, D) hidden of the positions that sample -> (S, V) logits: float32, or (float32=False) the
        head's dtype."""
        logits = self.lm_head(hidden)
        if self.cfg.logits_scaling != 1.0:  # Granite's
            logits = logits / self.cfg.logits_scaling
        return logits.float() if float32 else logits
