"""LFM2 (Liquid AI's LFM2-350M, 700M, 1.2B, 2.6B): a pre-norm decoder whose layers mix tokens either by GQA
attention or by a short gated convolution, which keeps a small recurrent state per sequence instead of a KV cache.

- Attention layers: llama's GQA (LlamaAttention, its KV cache layer cfg.kv_layers.index(i)), each q and k head RMS-normed (q_layernorm / k_layernorm, plain weights) before
  rotary over the whole head (NeoX halves); the output projection is out_proj.
- Conv layers (LFM2's "short conv"): in_proj (D -> 3D) gives B, C and x, D each; B * x goes through a depthwise
  causal conv of conv_L_cache taps (no bias, no activation), then y = C * conv; out_proj. Each sequence's last
  K - 1 values of B * x live in a slot of the worker's RecurrentStatePool between steps (its conv tensor; no
  delta-rule state: the ssm tensor is empty); layer j of cfg.linear_layers uses conv[j], and attention layer i
  uses the KV cache's layer cfg.kv_layers.index(i). On CPU with the native kernels, a step's leading decodes take
  tm_shortconv_decode (kernels.cpp: everything between in_proj and out_proj in one call), the rest the torch path.
- Every layer: operator_norm before the mixer, ffn_norm before a SwiGLU MLP (feed_forward: w1 gate, w3 up, w2
  down; its width from block_auto_adjust_ff_dim, loader/model_config.py); the final norm is named
  embedding_norm (it is applied after the last layer, not to the embeddings).

Checkpoints. HF (transformers' Lfm2ForCausalLM): conv.conv.weight (D, 1, K), embeddings usually tied. GGUF
(llama.cpp's converter, arch "lfm2"): head_count_kv per layer with 0 for the conv layers, shortconv.l_cache the
taps, shortconv.conv (D, K), the final norm as token_embd_norm; norms as they are.

LFM2-MoE (LFM2-8B-A1B; Lfm2MoeForCausalLM, GGUF arch "lfm2moe"): the same layers, but every layer from
cfg.dense_mlp_layers on (num_dense_layers, leading_dense_block_count) has a SparseMoE (layers/moe.py) for its
MLP: sigmoid scores, experts chosen by scores + expert_bias (selection only), the chosen scores renormalized
(norm_topk_prob; llama.cpp always) and times routed_scaling_factor. HF: feed_forward.gate (router),
feed_forward.experts.N.w1 / w3 / w2, feed_forward.expert_bias (our mlp.moe_statics.bias); the dense layers' MLP
is intermediate_size as it is (no block_auto_adjust_ff_dim). GGUF: ffn_gate_inp, ffn_{gate,up,down}_exps,
exp_probs_b.bias.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.gated_delta import (RecurrentStep, StateSeq, causal_conv1d, kernel_then_torch, leading_decodes,
                                         slot_tensors)
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.moe import SparseMoE
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryTables
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from tokenmill.models.qwen3_5 import HybridDecoderLayer, OneWeight, load_conv_weight, scratch_states
from tokenmill.native import kernels


class ShortConv(nn.Module):
    """(T, D) normed hidden -> (T, D): out_proj(C * conv(B * x)), (B, C, x) = in_proj(h)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.hidden = d
        self.in_proj = Linear(d, 3 * d, method)
        self.conv = OneWeight(d, cfg.linear_conv_kernel)
        self.conv.weight.weight_loader = load_conv_weight  # type: ignore[attr-defined]
        self.out_proj = Linear(d, d, method)
        self.state_index = cfg.linear_layers.index(layer_idx)  # its conv window in the pool
        # the native decode kernel's float32 copy of the conv's weight (D, K) (finish_native; None: torch only)
        self.native: torch.Tensor | None = None

    def finish_native(self) -> None:
        """On CPU with the native kernels, the conv's weight in float32 for tm_shortconv_decode, from the values the
        torch path uses (after the cast to the compute dtype); otherwise none."""
        w = self.conv.weight
        self.native = w.detach().float().contiguous() if w.is_cpu and kernels.is_enabled() else None

    def forward(self, h: torch.Tensor, step: RecurrentStep) -> torch.Tensor:
        """The decodes (one token each, not chained on an earlier seq, leading the step at rows 0..n-1) take the
        native kernel where it is built, before the rest (which may be chained on them); the rest, torch."""
        bcx = self.in_proj(h)  # (T, 3D): B | C | x
        decodes = leading_decodes(step.seqs) if self.native is not None else []
        n = len(decodes)
        mixed = bcx.new_empty(h.shape[0], self.hidden)  # (T, D): C * conv(B * x)
        if decodes:
            assert self.native is not None
            src, dst = slot_tensors(decodes)
            if not kernels.shortconv_decode(mixed[:n], bcx[:n], self.native, step.conv[self.state_index], src, dst):
                decodes = []  # shapes the kernel does not take (nothing written): all through torch
        return self.out_proj(kernel_then_torch(step.seqs, decodes, mixed, lambda seqs: self._mix(bcx, step, seqs)))

    def _mix(self, bcx: torch.Tensor, step: RecurrentStep, seqs: list[StateSeq]) -> torch.Tensor:
        """The torch path between the projections for `seqs` (other rows come back as zeros): bcx (T, 3D) -> C *
        conv(B * x) (T, D) in bcx's dtype."""
        b, c, x = bcx.chunk(3, dim=-1)
        y = causal_conv1d(b * x, self.conv.weight, step.conv[self.state_index], seqs, activation=False)
        return c * y


class Lfm2DecoderLayer(HybridDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # operator_norm
        self.is_conv = layer_idx in cfg.linear_layers
        if self.is_conv:
            self.conv = ShortConv(cfg, layer_idx, method)
        else:
            self.self_attn = LlamaAttention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # ffn_norm
        self.mlp = mlp
        self.residual_multiplier = 1.0

    def mix(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        return self.conv(h, attn.recurrent) if self.is_conv else self.self_attn(h, rope, attn)


class Lfm2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Lfm2DecoderLayer
    packed_modules_mapping = {
        **LlamaForCausalLM.packed_modules_mapping,
        "operator_norm": ("input_layernorm", None), "ffn_norm": ("post_attention_layernorm", None),
        "feed_forward": ("mlp", None), "w1": ("gate_up_proj", "gate"), "w3": ("gate_up_proj", "up"),
        "w2": ("down_proj", None), "q_layernorm": ("q_norm", None), "k_layernorm": ("k_norm", None),
        "embedding_norm": ("norm", None),
    }

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """The attention's out_proj as our o_proj (a conv layer's out_proj keeps its name)."""
        for name, tensor in weights:
            yield name.replace(".self_attn.out_proj.", ".self_attn.o_proj."), tensor

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """LlamaForCausalLM.forward; without a step's states (a forward outside the runner), each sequence of the
        step must start at position 0 and gets a zero state that is dropped afterwards."""
        if attn.recurrent is None:
            attn = AttentionContext(attn.backend, attn.metadata, attn.kv_caches,
                                    scratch_states(self.cfg, attn, self.lm_head.weight.device))
        return super().forward(input_ids, positions, attn, num_layers)

    def finish_native_layers(self) -> None:
        for m in self.modules():  # after the cast: the kernel's float32 copies of what the torch path uses
            if isinstance(m, ShortConv):
                m.finish_native()


class Lfm2MoeForCausalLM(Lfm2ForCausalLM):
    """LFM2 with experts past the leading dense layers (the module docstring)."""

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        if layer_idx in cfg.dense_mlp_layers:
            return LlamaMLP(cfg, method)
        return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         cfg.moe_renormalize, method, selection_bias=cfg.moe_selection_bias,
                         sigmoid=cfg.moe_sigmoid, routed_scaling=cfg.moe_routed_scaling)

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Lfm2's renaming, and HF's `feed_forward.expert_bias` (E,) as our `moe_statics.bias`."""
        for name, tensor in Lfm2ForCausalLM.checkpoint_stream(weights):
            if name.endswith(".feed_forward.expert_bias"):
                name = name.replace(".expert_bias", ".moe_statics.bias")
            yield name, tensor
