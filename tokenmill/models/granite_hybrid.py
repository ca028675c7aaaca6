"""Granite 4.0-H (IBM's granite-4.0-h-micro, -tiny, -small; transformers' GraniteMoeHybridForCausalLM): llama's
pre-norm layer where most layers mix tokens with a Mamba2 selective scan (a recurrent state per sequence) instead
of attention, with Granite's four multipliers (ModelConfig: embeddings, attention scale, residual, logits).

- Attention layers: llama's GQA (LlamaAttention, its KV cache layer cfg.kv_layers.index(i)), scaled by
  attention_multiplier, rotated only where position_embedding_type is "rope" (the released models: NoPE, every
  layer in cfg.nope_layers).
- Mamba2 layers (layers/mamba2.py has the scan): in_proj (D -> I + C + H) gives the gate z (I = d_inner = H P),
  xBC (C = I + 2 G N) and dt (H); xBC through a depthwise causal conv of K taps with a bias, then SiLU; x (H, P),
  B, C (G, N each); y = scan(x, dt, B, C) with dt = softplus(dt + dt_bias), A = -exp(A_log) and the D skip;
  out_proj(w * rmsnorm(y * silu(z)) per group of I / G channels). Each sequence's conv window (C, K - 1) and state
  (H, P, N) live in a slot of the worker's RecurrentStatePool (conv[j], ssm[j] for the j-th layer of
  cfg.linear_layers). On CPU with the native kernels, a step's unchained single-token sequences (rows 0..n-1)
  take tm_mamba2_decode (kernels.cpp: everything between in_proj and out_proj in one call), the rest the torch path.
- The MLP: experts (softmax over the top-k logits) plus an ungated shared MLP (Tiny, Small: SparseMoE), or the
  shared MLP alone (Micro, num_local_experts 0: a dense SwiGLU MLP).

Checkpoints. HF: mamba.conv1d.weight (C, 1, K) and .bias, A_log, dt_bias, D (H,), mamba.norm.weight (I,); the
experts stacked as Granite MoE's (block_sparse_moe.input_linear (E, 2I', D), output_linear, router.layer), the
shared MLP as shared_mlp.input_linear (gate rows, then up) / output_linear. GGUF (llama.cpp's converter, arch
"granitehybrid"): a head_count_kv of 0 marks a Mamba2 layer; ssm_in, ssm_conv1d (C, K) and its bias, ssm_dt.bias
(dt_bias), ssm_a = -exp(A_log) and ssm_d as (H, 1), ssm_norm as (G, I / G), ssm_out; q / k rows permuted as
llama's (undone at load); the experts as ffn_*_exps and the shared MLP as ffn_*_shexp, or (Micro) ffn_gate / up /
down.
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
from tokenmill.layers.mamba2 import gated_rms_norm, mamba2_scan
from tokenmill.layers.moe import SparseMoE
from tokenmill.layers.norm import RMSNorm
from tokenmill.layers.rotary import RotaryTables
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from tokenmill.models.moe import MoEForCausalLM
from tokenmill.models.qwen3_5 import HybridDecoderLayer, OneWeight, load_conv_weight, scratch_states
from tokenmill.native import kernels


def _load_flat(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
    """A vector the GGUF stores reshaped (ssm_norm (G, I / G), ssm_d (H, 1)) or as it is."""
    if tensor.numel() != param.data.numel():
        raise ValueError(f"weight has shape {tuple(tensor.shape)}, expected {tuple(param.data.shape)}")
    param.data.copy_(tensor.reshape(param.data.shape).to(torch.float32))


class _Conv(nn.Module):
    """The depthwise conv's weight (C, K) and bias (C,): HF's conv1d.weight / .bias names (zeros where the
    checkpoint has no bias: mamba_conv_bias false)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, kernel), requires_grad=False)
        self.weight.weight_loader = load_conv_weight  # type: ignore[attr-defined]
        self.bias = nn.Parameter(torch.zeros(channels), requires_grad=False)
        self.bias.is_required = False  # type: ignore[attr-defined]


class Mamba2Mixer(nn.Module):
    """(T, D) normed hidden -> (T, D) through a Mamba2 layer, reading and writing each sequence's conv window and
    state in the step's pools (gated_delta.py's src / dst and chaining)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.linear_num_value_heads, cfg.linear_key_head_dim
        self.groups, self.d_state = cfg.linear_num_key_heads, cfg.linear_value_head_dim
        self.inner, self.conv_dim = cfg.linear_value_dim_mamba, cfg.linear_conv_dim
        d = cfg.hidden_size
        self.in_proj = Linear(d, self.inner + self.conv_dim + self.heads, method)  # z | xBC | dt
        self.conv1d = _Conv(self.conv_dim, cfg.linear_conv_kernel)
        self.A_log = nn.Parameter(torch.zeros(self.heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.zeros(self.heads), requires_grad=False)
        self.D = nn.Parameter(torch.ones(self.heads), requires_grad=False)
        self.D.weight_loader = _load_flat  # type: ignore[attr-defined]
        self.norm = OneWeight(self.inner, fill=1.0)  # the gated norm's weight
        self.norm.weight.weight_loader = _load_flat  # type: ignore[attr-defined]
        self.out_proj = Linear(self.inner, d, method)
        self.eps = cfg.rms_norm_eps
        self.state_index = cfg.linear_layers.index(layer_idx)  # its conv window and state in the pool
        # -exp(A_log), dt_bias and D in float32 from the checkpoint's values, before any cast (finish)
        self.scan_params: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # the native decode kernel's float32 copies of the conv's weight and bias and the gated norm's weight
        # (finish_native; None: torch only)
        self.native: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def finish(self) -> None:
        self.scan_params = (-self.A_log.detach().float().exp(), self.dt_bias.detach().float(),
                            self.D.detach().float())
        self.finish_native()

    def finish_native(self) -> None:
        """On CPU with the native kernels, the conv's weight and bias and the gated norm's weight in float32 for
        tm_mamba2_decode, from the values the torch path uses (finish_loading calls it again after the cast to the
        compute dtype); otherwise none."""
        self.native = None
        if self.conv1d.weight.is_cpu and kernels.is_enabled():
            self.native = (self.conv1d.weight.detach().float().contiguous(),
                           self.conv1d.bias.detach().float().contiguous(),
                           self.norm.weight.detach().float().contiguous())

    def forward(self, h: torch.Tensor, step: RecurrentStep) -> torch.Tensor:
        """The decodes (one token each, not chained on an earlier seq, leading the step at rows 0..n-1) take the
        native kernel where it is built, before the rest (which may be chained on them); the rest, torch (as
        GatedDeltaNet.forward)."""
        assert self.scan_params is not None, "call finish_loading() first"
        z, xbc, dt = self.in_proj(h).split([self.inner, self.conv_dim, self.heads], dim=-1)
        decodes = leading_decodes(step.seqs) if self.native is not None else []
        n, j = len(decodes), self.state_index
        normed = h.new_empty(h.shape[0], self.inner)
        if decodes:
            assert self.native is not None
            neg_a, dt_bias, skip = self.scan_params
            src, dst = slot_tensors(decodes)
            if not kernels.mamba2_decode(normed[:n], xbc[:n], z[:n], dt[:n], self.native[0], self.native[1],
                                         step.conv[j], step.ssm[j], src, dst, neg_a, dt_bias, skip, self.native[2],
                                         self.groups, self.eps):
                decodes = []  # shapes the kernel does not take (nothing written): all through torch
        return self.out_proj(kernel_then_torch(step.seqs, decodes, normed,
                                               lambda seqs: self._mix(z, xbc, dt, step, seqs)))

    def _mix(self, z: torch.Tensor, xbc: torch.Tensor, dt: torch.Tensor, step: RecurrentStep,
             seqs: list[StateSeq]) -> torch.Tensor:
        """The torch path between the projections for `seqs` (other rows come back as zeros): z (T, I), xbc (T, C),
        dt (T, H) -> the gated norm's output (T, I) in z's dtype."""
        assert self.scan_params is not None
        T, j = z.shape[0], self.state_index
        gn = self.groups * self.d_state
        xbc = causal_conv1d(xbc, self.conv1d.weight, step.conv[j], seqs, bias=self.conv1d.bias)  # SiLU'd
        x, B, C = xbc.split([self.inner, gn, gn], dim=-1)
        neg_a, dt_bias, skip = self.scan_params
        y = mamba2_scan(x.unflatten(1, (self.heads, self.head_dim)), dt, B.unflatten(1, (self.groups, self.d_state)),
                        C.unflatten(1, (self.groups, self.d_state)), neg_a, skip, dt_bias, step.ssm[j], seqs)
        return gated_rms_norm(y.reshape(T, self.inner), z, self.norm.weight, self.groups, self.eps)


class GraniteHybridDecoderLayer(HybridDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod, mlp: nn.Module) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.is_mamba = layer_idx in cfg.linear_layers
        if self.is_mamba:
            self.mamba = Mamba2Mixer(cfg, layer_idx, method)
        else:
            self.self_attn = LlamaAttention(cfg, layer_idx, method)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp
        self.residual_multiplier = cfg.residual_multiplier

    def mix(self, h: torch.Tensor, rope: RotaryTables, attn: AttentionContext) -> torch.Tensor:
        return self.mamba(h, attn.recurrent) if self.is_mamba else self.self_attn(h, rope, attn)


_DENSE_RENAMES = {"shared_mlp.input_linear": "mlp.gate_up_proj", "shared_mlp.output_linear": "mlp.down_proj"}


class GraniteHybridForCausalLM(LlamaForCausalLM):
    decoder_layer = GraniteHybridDecoderLayer

    def __init__(self, cfg: ModelConfig, method: LinearMethod, max_positions: int) -> None:
        super().__init__(cfg, method, max_positions)
        # HF's stacked experts and shared MLP (Granite MoE's names), or the shared MLP as the dense one (Micro)
        self.checkpoint_renames = MoEForCausalLM.checkpoint_renames if cfg.num_experts else _DENSE_RENAMES

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        if not cfg.num_experts:
            return LlamaMLP(cfg, method)
        return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         cfg.moe_renormalize, method, cfg.shared_expert_intermediate_size, cfg.shared_expert_gated)

    def finish_loading(self, device: torch.device, dtype: torch.dtype) -> None:
        for m in self.modules():  # before the cast: the scan's parameters from the checkpoint's float32 values
            if isinstance(m, Mamba2Mixer):
                m.to(device)
                m.finish()
        super().finish_loading(device, dtype)

    def finish_native_layers(self) -> None:
        for m in self.modules():  # after the cast: the kernel's float32 copies of what the torch path uses
            if isinstance(m, Mamba2Mixer):
                m.finish_native()

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """A GGUF's ssm_a (-exp(A_log)) and ssm_dt.bias as A_log and dt_bias."""
        for name, tensor in weights:
            if name.endswith(".mamba.ssm_a"):
                yield name[: -len("ssm_a")] + "A_log", torch.log(-tensor.float()).reshape(-1)
            elif name.endswith(".mamba.ssm_dt.bias"):
                yield name[: -len("ssm_dt.bias")] + "dt_bias", tensor.reshape(-1)
            else:
                yield name, tensor

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext,
                num_layers: int | None = None) -> torch.Tensor:
        """LlamaForCausalLM.forward; without a step's states (a forward outside the runner), each sequence of the
        step must start at position 0 and gets a zero state that is dropped afterwards."""
        if attn.recurrent is None:
            attn = AttentionContext(attn.backend, attn.metadata, attn.kv_caches,
                                    scratch_states(self.cfg, attn, self.lm_head.weight.device))
        return super().forward(input_ids, positions, attn, num_layers)
