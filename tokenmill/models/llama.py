"""Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2), device-free, with fused QKV and gate/up.

Shapes: T = tokens in the step (all requests, flattened), D = hidden, nh/nkv = heads, hd = head dim.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.layers.attention import AttentionMetadata, paged_attention, write_kv
from tokenmill.layers.linear import convert_weight, linear
from tokenmill.layers.rotary import RotaryEmbedding, inv_frequencies, rotate
from tokenmill.loader.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, kv = self.nh * self.hd, self.nkv * self.hd
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.input_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.post_attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qkv_weight = nn.Parameter(torch.empty(q + 2 * kv, d), requires_grad=False)  # rows: q | k | v
        self.qkv_bias = nn.Parameter(torch.zeros(q + 2 * kv), requires_grad=False) if cfg.attention_bias else None
        self.o_weight = nn.Parameter(torch.empty(d, q), requires_grad=False)
        self.gate_up_weight = nn.Parameter(torch.empty(2 * i, d), requires_grad=False)  # rows: gate | up
        self.down_weight = nn.Parameter(torch.empty(d, i), requires_grad=False)
        self.scale = self.hd ** -0.5
        # int8 mode: per-channel scales of the four projections (None: fp weights)
        self.scales: dict[str, torch.Tensor | None] = {"qkv": None, "o": None, "gate_up": None, "down": None}
        # prepacked mode: oneDNN copies of the four projections (None: use the plain weight)
        self.packed: dict[str, torch.Tensor | None] = {"qkv": None, "o": None, "gate_up": None, "down": None}

    def convert_weights(self, mode: str) -> None:
        """Replace the projection weights with int8 or oneDNN-prepacked copies (`convert_weight`'s modes);
        the originals are dropped."""
        for name in self.scales:
            param: nn.Parameter = getattr(self, f"{name}_weight")
            param.data, self.scales[name], self.packed[name] = convert_weight(param.data, mode)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """x: (T, D) residual stream -> (T, D)."""
        T = x.shape[0]
        h = self.input_norm(x)
        sc, pk = self.scales, self.packed
        qkv = linear(h, self.qkv_weight, sc["qkv"], self.qkv_bias, pk["qkv"])  # (T, (nh + 2 nkv) hd)
        qk, v = qkv.split([(self.nh + self.nkv) * self.hd, self.nkv * self.hd], dim=-1)
        qk = rotate(qk.view(T, self.nh + self.nkv, self.hd), rope)  # q and k heads are adjacent: one pass
        q, k = qk[:, : self.nh], qk[:, self.nh :]
        v = v.view(T, self.nkv, self.hd)
        write_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)
        attn = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.layer_idx)
        x = x + linear(attn.reshape(T, -1), self.o_weight, sc["o"], packed=pk["o"])
        h = self.post_attn_norm(x)
        gate, up = linear(h, self.gate_up_weight, sc["gate_up"], packed=pk["gate_up"]).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.down_weight, sc["down"], packed=pk["down"])


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_positions = max_positions
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_word_embeddings else
                        nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False))
        self.rope: RotaryEmbedding | None = None
        # the output layer converted like the projections (weight, scales, packed); a copy when tied
        self._head_mm: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None = None
        self._rope_freqs: torch.Tensor | None = None

    # -- weights ---------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take HF-named tensors; fuse q/k/v and gate/up into this model's parameters."""
        cfg = self.cfg
        q, kv, i = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        qkv_rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        gu_rows = {"gate_proj": (0, i), "up_proj": (i, 2 * i)}
        loaded: set[str] = set()
        for name, w in weights:
            w = w.to(torch.float32)
            loaded.add(name)
            if name == "model.embed_tokens.weight":
                self.embed.data.copy_(w)
            elif name == "model.norm.weight":
                self.norm.weight.data.copy_(w)
            elif name == "lm_head.weight":
                if self.lm_head is not None:
                    self.lm_head.data.copy_(w)
            elif name == "rope_freqs":
                self._rope_freqs = w
            elif name.startswith("model.layers."):
                parts = name.split(".")
                layer: DecoderLayer = self.layers[int(parts[2])]  # type: ignore[assignment]
                sub, kind = parts[-2], parts[-1]
                if sub in qkv_rows:
                    a, b = qkv_rows[sub]
                    if kind == "weight":
                        layer.qkv_weight.data[a:b].copy_(w)
                    elif layer.qkv_bias is not None:
                        layer.qkv_bias.data[a:b].copy_(w)
                elif sub in gu_rows:
                    a, b = gu_rows[sub]
                    layer.gate_up_weight.data[a:b].copy_(w)
                elif sub == "o_proj":
                    layer.o_weight.data.copy_(w)
                elif sub == "down_proj":
                    layer.down_weight.data.copy_(w)
                elif sub == "input_layernorm":
                    layer.input_norm.weight.data.copy_(w)
                elif sub == "post_attention_layernorm":
                    layer.post_attn_norm.weight.data.copy_(w)
                elif "rotary_emb" not in name:
                    raise ValueError(f"unexpected weight {name}")
            elif "rotary_emb" not in name:
                raise ValueError(f"unexpected weight {name}")
        need = {"model.embed_tokens.weight", "model.norm.weight"}
        if self.lm_head is not None:
            need.add("lm_head.weight")
        for n in range(cfg.num_layers):
            for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                need.add(f"model.layers.{n}.{p}.weight")
        if missing := need - loaded:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}")

    def finish_loading(self, device: torch.device, dtype: torch.dtype, quantization: str | None = None,
                       prepack_weights: bool = False) -> None:
        """Move to device/dtype, then optionally quantise (int8) or prepack (oneDNN) the matmul weights."""
        self.to(device=device, dtype=dtype)
        if quantization not in (None, "int8"):
            raise ValueError(f"quantization {quantization!r} is not supported (supported: int8)")
        mode = quantization or ("prepack" if prepack_weights else None)  # int8 takes precedence
        if mode is not None:
            for layer in self.layers:
                layer.convert_weights(mode)  # type: ignore[operator]
            w = self.embed if self.lm_head is None else self.lm_head
            self._head_mm = convert_weight(w.data, mode)
            self.lm_head = None  # the converted copy replaces it; the embedding stays for lookups
        inv = inv_frequencies(self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling, self._rope_freqs)
        self.rope = RotaryEmbedding(self.cfg.head_dim, self.max_positions, inv, device, dtype)

    # -- compute ---------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """input_ids, positions: (T,) -> final hidden states (T, D)."""
        assert self.rope is not None, "call finish_loading() first"
        x = F.embedding(input_ids, self.embed)
        rope = self.rope.tables(positions)  # (T, 1, hd) cos / sin rows, shared by every layer
        for layer, cache in zip(self.layers, kv_caches):
            x = layer(x, rope, cache, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(S, D) hidden of the positions that sample -> (S, V) float32 logits."""
        if self._head_mm is not None:
            w, scales, packed = self._head_mm
            return linear(hidden, w, scales, packed=packed).float()
        w = self.embed if self.lm_head is None else self.lm_head
        return F.linear(hidden, w).float()
