"""Qwen3.5 (the dense 0.8B, 2B, 4B, 9B and 27B, and the MoE ones; their VL checkpoints' language model): llama's pre-norm layer
where three of every four layers mix tokens with a Gated DeltaNet (linear attention with a recurrent state)
instead of attention.

- Norms are zero-centred: the checkpoint stores w and the scale is 1 + w (RMSNorm's unit_offset; the per-head
  q / k norms too). llama.cpp's converter stores 1 + w (loader/weights.py takes the 1 off again).
- Attention layers (every 4th): q / k RMS-normed per head, a quarter of each head rotated (its interleaved
  M-RoPE is plain rotary when every position id is the text's), and an output gate: q_proj's rows are, per
  head, hd of q then hd of gate, and the attention output is multiplied by sigmoid(gate) before o_proj.
- Gated DeltaNet layers (layers/gated_delta.py has the recurrence): x -> in_proj_qkv (q|k|v, Hk dk + Hk dk +
  Hv dv), in_proj_z (Hv dv), in_proj_b and in_proj_a (Hv each); q|k|v through a depthwise causal conv of K
  taps and SiLU; beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (log-decay per value head);
  o = delta rule(q, k, v, g, beta) per value head; o = rmsnorm(o) * w * silu(z) per head (the gated norm: a
  plain weight); out_proj(o). Each sequence's conv window and state matrix live in a slot of the worker's
  RecurrentStatePool between steps (AttentionContext.recurrent); layers without a KV cache have no
  entry in it, so attention layer i uses the cache's layer cfg.kv_layers.index(i).

Decode steps of the dense models on the gguf method run in one native call (models/native_decode.py) with the
kernels these layers call (the head norms, the output gate's tm_sigmoid_mul, tm_gdn_decode), so bit for bit the
same; the MoE ones (a gated shared expert) run layer by layer.

Checkpoints. HF (transformers' Qwen3_5ForCausalLM, or the VL Qwen3_5ForConditionalGeneration whose language
model sits under `model.language_model.`, beside the vision tower and the multi-token-prediction layers,
which are skipped): conv1d.weight (C, 1, K), A_log and dt_bias (Hv,). GGUF (llama.cpp's converter, arch
"qwen35"): ssm_conv1d (C, K), ssm_a = -exp(A_log), ssm_dt.bias = dt_bias, norms + 1 but ssm_norm; where
there are more value heads than key heads it reorders the value heads from grouped (value head j reads key
head j // r) to tiled (j % Hk) in every tensor that has them, which the model then computes as they are
(ModelConfig.linear_v_heads_tiled).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.attention.backend import AttentionContext
from tokenmill.layers.activation import sigmoid_gate
from tokenmill.layers.gated_delta import (RecurrentStep, StateSeq, causal_conv1d, gated_delta_rule, kernel_then_torch,
                                         leading_decodes, slot_tensors)
from tokenmill.layers.head_norm import HeadRMSNorm
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.moe import SparseMoE
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryTables, rotate_
from tokenmill.loader.model_config import ModelConfig
from tokenmill.native import kernels
from tokenmill.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3_5Attention(LlamaAttention):
    output_gate = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__(cfg, layer_idx, method)
        q, kv = self.nh * self.hd, self.nkv * self.hd
        # per head: hd rows of q, then hd of its output gate (the checkpoint's order)
        self.qkv_proj = Linear(cfg.hidden_size, 2 * q + 2 * kv, method, bias=cfg.attention_bias,
                               shards={"q": 2 * q, "k": kv, "v": kv})
        self.q_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps, weight_offset=1.0)
        self.k_norm = HeadRMSNorm(self.hd, cfg.rms_norm_eps, weight_offset=1.0)

    def forward(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        """h: (T, D) normed hidden -> (T, D)."""
        T, nh, nkv, hd = h.shape[0], self.nh, self.nkv, self.hd
        qg, k, v = self.qkv_proj(h).split([2 * nh * hd, nkv * hd, nkv * hd], dim=-1)
        qg = qg.view(T, nh, 2, hd)
        # q's heads out from between their gates, beside k's (T, nh + nkv, hd); normed in place, then rotated
        qk = rotate_(self._norm_qk(torch.cat([qg[:, :, 0], k.reshape(T, nkv, hd)], dim=1)), rope)
        o = attn.backend.forward(self.layer_idx, qk[:, :nh], qk[:, nh:], v.reshape(T, nkv, hd),
                                 attn.kv_caches[self.layer_idx], attn.metadata, self.scale)
        return self.o_proj(sigmoid_gate(o.reshape(T, nh, hd), qg[:, :, 1]).reshape(T, nh * hd))


class OneWeight(nn.Module):
    """A module holding one parameter named `weight` (the conv's and the gated norm's checkpoint names; LFM2's conv
    too)."""

    def __init__(self, *shape: int, fill: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full(shape, fill), requires_grad=False)


def load_conv_weight(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
    """HF's (C, 1, K) or a GGUF's (C, K) -> (C, K) (Qwen3.5's and LFM2's conv)."""
    t = tensor.reshape(tensor.shape[0], -1) if tensor.dim() == 3 else tensor
    if t.shape != param.data.shape:
        raise ValueError(f"conv1d weight has shape {tuple(tensor.shape)}, expected {tuple(param.data.shape)}")
    param.data.copy_(t.to(torch.float32))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.conv_dim, self.value_dim = cfg.linear_conv_dim, cfg.linear_value_dim
        d = cfg.hidden_size
        self.in_proj_qkvz = Linear(d, self.conv_dim + self.value_dim, method,
                                   shards={"qkv": self.conv_dim, "z": self.value_dim})
        self.in_proj_ba = Linear(d, 2 * self.hv, method, shards={"b": self.hv, "a": self.hv})
        self.conv1d = OneWeight(self.conv_dim, cfg.linear_conv_kernel)
        self.conv1d.weight.weight_loader = load_conv_weight  # type: ignore[attr-defined]
        self.A_log = nn.Parameter(torch.zeros(self.hv), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv), requires_grad=False)
        self.norm = OneWeight(self.dv, fill=1.0)  # the gated norm's plain weight
        self.out_proj = Linear(self.value_dim, d, method)
        self.eps = cfg.rms_norm_eps
        self.state_index = cfg.linear_layers.index(layer_idx)  # its state in the pool
        self.v_heads_tiled = cfg.linear_v_heads_tiled
        self.neg_a: torch.Tensor | None = None  # -exp(A_log), float32 (finish)
        self.dt_f32: torch.Tensor | None = None
        # the native decode kernel's float32 copies of the conv and the gated norm (finish; None: torch only)
        self.native: tuple[torch.Tensor, torch.Tensor] | None = None

    def finish(self, A_log: torch.Tensor, dt_bias: torch.Tensor) -> None:
        """The decay's parameters in float32, from the checkpoint's values before any cast to the compute dtype;
        on CPU with the native kernels, the conv's and the gated norm's weights in float32 for tm_gdn_decode."""
        self.neg_a = -A_log.detach().float().exp()
        self.dt_f32 = dt_bias.detach().float()
        if self.neg_a.is_cpu and kernels.is_enabled():
            self.native = (self.conv1d.weight.detach().float().contiguous(),
                           self.norm.weight.detach().float().contiguous())

    def forward(self, h: torch.Tensor, step: RecurrentStep) -> torch.Tensor:
        """h: (T, D) normed hidden -> (T, D); reads and writes each sequence's state in `step` (each from its read
        slot to its write slot; gated_delta.py's src/dst and chaining). The decodes (one token each, not chained on
        an earlier seq, leading the step at rows 0..n-1) take the native kernel where it is built, before the rest
        (which may be chained on them); the rest, torch."""
        assert self.neg_a is not None and self.dt_f32 is not None, "call finish_loading() first"
        T = h.shape[0]
        qkv, z = self.in_proj_qkvz(h).split([self.conv_dim, self.value_dim], dim=-1)
        ba = self.in_proj_ba(h)
        decodes = leading_decodes(step.seqs) if self.native is not None else []
        n, j = len(decodes), self.state_index
        normed = h.new_empty(T, self.value_dim)
        if decodes:
            assert self.native is not None
            src, dst = slot_tensors(decodes)
            if not kernels.gdn_decode(normed[:n], qkv[:n], z[:n], ba[:n], self.native[0], step.conv[j], step.ssm[j],
                                      src, dst, self.neg_a, self.dt_f32, self.native[1], self.hk,
                                      self.v_heads_tiled, self.eps):
                decodes = []  # shapes the kernel does not take (nothing written): all through torch
        return self.out_proj(kernel_then_torch(step.seqs, decodes, normed,
                                               lambda seqs: self._mix(qkv, z, ba, step, seqs)))

    def _mix(self, qkv: torch.Tensor, z: torch.Tensor, ba: torch.Tensor, step: RecurrentStep,
             seqs: list[StateSeq]) -> torch.Tensor:
        """The torch path between the projections for `seqs` (other rows come back as zeros): qkv (T, C), z
        (T, Hv dv), ba (T, 2 Hv) -> the gated norm's output (T, Hv dv) in qkv's dtype."""
        assert self.neg_a is not None and self.dt_f32 is not None
        T = qkv.shape[0]
        b, a = ba.split([self.hv, self.hv], dim=-1)
        j = self.state_index
        step = RecurrentStep(seqs, step.conv, step.ssm)
        mixed = causal_conv1d(qkv, self.conv1d.weight, step.conv[j], step.seqs)  # (T, C), SiLU applied
        kd = self.hk * self.dk
        q, k, v = mixed.split([kd, kd, self.value_dim], dim=-1)
        beta = torch.sigmoid(b.float())
        g = self.neg_a * F.softplus(a.float() + self.dt_f32)  # (T, Hv) log-decay, <= 0
        o = gated_delta_rule(q.reshape(T, self.hk, self.dk), k.reshape(T, self.hk, self.dk),
                             v.reshape(T, self.hv, self.dv), g, beta, step.ssm[j], step.seqs,
                             v_heads_tiled=self.v_heads_tiled)  # (T, Hv, dv)
        # the gated norm, per value head: rmsnorm(o) * w, then * silu(z) (in float32, as the reference)
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (self.norm.weight * of.to(qkv.dtype)).float() * F.silu(z.reshape(T, self.hv, self.dv).float())
        return normed.to(qkv.dtype).reshape(T, self.value_dim)


class HybridDecoderLayer(LlamaDecoderLayer):
    """llama's residual contract (LlamaDecoderLayer.forward, Granite's residual_multiplier included) with the token
    mixer chosen by the layer's type: a recurrent one, given the step's states, or attention (`mix`, each family's
    own)."""

    def mix(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RotaryTables,
                attn: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        m = self.residual_multiplier
        a = self.mix(h, rope, attn)
        h, residual = self.post_attention_layernorm(a if m == 1.0 else a.mul_(m), residual)
        out = self.mlp(h)
        return (out if m == 1.0 else out.mul_(m)), residual


class Qwen3_5DecoderLayer(HybridDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.is_linear = layer_idx in cfg.linear_layers
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg, layer_idx, method)
        else:
            self.self_attn = Qwen3_5Attention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.mlp = mlp
        self.residual_multiplier = 1.0

    def mix(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        return self.linear_attn(h, attn.recurrent) if self.is_linear else self.self_attn(h, rope, attn)


class Qwen3_5ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen3_5DecoderLayer
    packed_modules_mapping = {
        **LlamaForCausalLM.packed_modules_mapping,
        "in_proj_qkv": ("in_proj_qkvz", "qkv"), "in_proj_z": ("in_proj_qkvz", "z"),
        "in_proj_b": ("in_proj_ba", "b"), "in_proj_a": ("in_proj_ba", "a"),
    }

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        super().__init__(cfg, method, max_positions)
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=True)
        self.model.norm.weight.is_required = False  # type: ignore[attr-defined]

    def _delta_nets(self) -> list[GatedDeltaNet]:
        return [m for m in self.modules() if isinstance(m, GatedDeltaNet)]

    def finish_loading(self, device: torch.device, dtype: torch.dtype) -> None:
        for m in self._delta_nets():  # before the cast: the decay from the checkpoint's float32 values
            m.finish(m.A_log.to(device), m.dt_bias.to(device))
        super().finish_loading(device, dtype)

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """The VL checkpoint's language model under our names, its vision tower and multi-token-prediction
        layers skipped; a GGUF's ssm_a (-exp(A_log)) and ssm_dt.bias as A_log and dt_bias."""
        for name, tensor in weights:
            if name.startswith(("model.visual.", "mtp.", "model.mtp.")):
                continue
            if name.startswith("model.language_model."):
                name = "model." + name[len("model.language_model."):]
            if name.endswith(".linear_attn.ssm_a"):
                yield name[: -len("ssm_a")] + "A_log", torch.log(-tensor.float())
            elif name.endswith(".linear_attn.ssm_dt.bias"):
                yield name[: -len("ssm_dt.bias")] + "dt_bias", tensor
            else:
                yield name, tensor

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """LlamaForCausalLM.forward; without a step's states (a forward outside the runner), each sequence of
        the step must start at position 0 and gets a zero state that is dropped afterwards."""
        if attn.recurrent is None:
            attn = AttentionContext(attn.backend, attn.metadata, attn.kv_caches,
                                    scratch_states(self.cfg, attn, self.lm_head.weight.device))
        return super().forward(input_ids, positions, attn, num_layers)


def scratch_states(cfg: ModelConfig, attn: AttentionContext, device: torch.device) -> RecurrentStep:
    """Zero states for a forward outside the runner (every sequence of the step starts at position 0), dropped
    afterwards: Qwen3.5's, LFM2's (models/lfm2.py; no delta-rule state, a zero-size ssm) and Granite 4.0-H's Mamba2
    ones (models/granite_hybrid.py)."""
    meta = attn.metadata
    if meta.num_decodes or any(p.start for p in meta.prefills):
        raise ValueError("a step that continues a sequence needs its recurrent state (AttentionContext.recurrent)")
    n, layers = len(meta.prefills), len(cfg.linear_layers)
    conv = torch.zeros((layers, n, cfg.linear_conv_dim, cfg.linear_conv_kernel - 1), device=device)
    ssm = torch.zeros((layers, n, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                      device=device)
    return RecurrentStep([StateSeq(i, p.q_start, p.q_len, True) for i, p in enumerate(meta.prefills)], conv, ssm)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3.5 MoE: every layer's MLP is experts (softmax over all, top-k, renormalized) beside a shared expert
    behind a sigmoid gate (Qwen2-MoE's); the checkpoints' per-expert names are Qwen3-MoE's."""

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         cfg.moe_renormalize, method, cfg.shared_expert_intermediate_size, cfg.shared_expert_gated)
