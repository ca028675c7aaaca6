"""gpt-oss (OpenAI's gpt-oss-20b and -120b): llama's pre-norm layer with three differences.

- Attention: q/k/v and o with biases; every other layer (the even ones) over a sliding window of 128 keys;
  and a learned sink logit per query head in each softmax (`self_attn.sinks`, (nh,)), which takes its
  share of the weight and selects no value (attention/backend.py):
      out = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j))
- The MLP is a mixture of experts whose router has a bias and picks top_k by logit, weighted by the softmax
  of the chosen logits (= softmax over all, top-k, renormalized: moe_renormalize); each expert has biases
  and gpt-oss's clamped SwiGLU (layers/activation.py, SwigluOAI):
      g = min(gate, 7), u = clamp(up, -7, 7), y = down((u + 1) * g * sigmoid(1.702 g))
- YaRN rotary (factor 32 over 4096 positions) without rounding the ramp's ends (HF's truncate: false).

Checkpoints. HF (transformers' GptOssForCausalLM): `mlp.router` is our `mlp.gate`; the experts are stacked,
`mlp.experts.gate_up_proj` (E, D, 2I) with gate and up in alternating columns, `gate_up_proj_bias` (E, 2I),
`down_proj` (E, I, D), `down_proj_bias` (E, D): split per expert, transposed and de-interleaved by
`checkpoint_stream`. OpenAI's released checkpoints store those matrices as MXFP4 (`*_blocks` uint8 (E, out,
D/32, 16), `*_scales` (E, out, D/32)); they are decoded to floats here (a GGUF keeps them as ggml's MXFP4
blocks instead, on the gguf method). GGUF (llama.cpp's converter, arch "gpt-oss"): `attn_sinks`,
`post_attention_norm` (the norm before the MLP), `ffn_gate_inp` with its bias, and gate, up and down as separate
3-D expert tensors with 2-D biases (loader/weights.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from tokenmill.layers.activation import SwigluOAI
from tokenmill.layers.linear import Linear, LinearMethod
from tokenmill.layers.mlp import GatedMLP
from tokenmill.layers.moe import SparseMoE
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

_SINKS = ".self_attn.sinks"


class GptOssAttention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, layer_idx: int, method: LinearMethod) -> None:
        super().__init__(cfg, layer_idx, method)
        self.o_proj = Linear(self.nh * self.hd, cfg.hidden_size, method, bias=True)
        self.sinks = nn.Parameter(torch.zeros(self.nh), requires_grad=False)


class GptOssDecoderLayer(LlamaDecoderLayer):
    attention = GptOssAttention


class GptOssMoE(SparseMoE):
    """SparseMoE with a biased router and biased experts on gpt-oss's clamped SwiGLU."""

    def __init__(self, cfg: ModelConfig, method: LinearMethod) -> None:
        super().__init__(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         True, method)
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, method, bias=True)
        act = SwigluOAI(cfg.swiglu_alpha, cfg.swiglu_limit)
        self.experts = nn.ModuleList(GatedMLP(cfg.hidden_size, cfg.moe_intermediate_size, method, bias=True, act=act)
                                     for _ in range(cfg.num_experts))


class GptOssForCausalLM(LlamaForCausalLM):
    decoder_layer = GptOssDecoderLayer
    activations = ("silu",)  # HF's config says silu; the experts' clamped form is the family's own

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        return GptOssMoE(cfg, method)

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """An HF checkpoint's (name, tensor) pairs as the ones our modules take (module docstring); a GGUF's
        (already per expert) as they are but for the sinks' `.weight`."""
        blocks: dict[str, torch.Tensor] = {}  # an MXFP4 matrix's blocks, until its scales arrive
        for name, tensor in weights:
            name = name.replace(".mlp.router.", ".mlp.gate.")
            if name.endswith(_SINKS + ".weight"):  # GGUF's blk.N.attn_sinks.weight
                name = name[: -len(".weight")]
            prefix, _, leaf = name.rpartition(".mlp.experts.")
            if not prefix or leaf not in _STACKED:
                yield name, tensor
                continue
            if leaf.endswith("_blocks"):
                blocks[leaf[: -len("_blocks")]] = tensor
                continue
            if leaf.endswith("_scales"):  # (E, out, in) as stored: gate_up's rows alternate gate, up
                leaf = leaf[: -len("_scales")]
                if leaf not in blocks:
                    raise ValueError(f"{name} without its {leaf}_blocks")
                tensor = mxfp4_to_float(blocks.pop(leaf), tensor)
            else:  # transformers' (E, in, out), x @ w
                tensor = tensor if leaf.endswith("_bias") else tensor.transpose(1, 2)
            yield from _per_expert(prefix + ".mlp.experts.{e}.", leaf, tensor)
        if blocks:
            raise ValueError(f"gpt-oss MXFP4 blocks without scales: {sorted(blocks)}")


_STACKED = {f"{m}{s}" for m in ("gate_up_proj", "down_proj") for s in ("", "_bias", "_blocks", "_scales")}


def _per_expert(p: str, leaf: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A stacked expert tensor, (E, out, in) or a bias (E, out), as each expert's gate / up / down; gate_up's
    rows alternate gate and up."""
    kind = "bias" if leaf.endswith("_bias") else "weight"
    for e in range(t.shape[0]):
        if leaf.startswith("gate_up_proj"):
            yield p.format(e=e) + f"gate_proj.{kind}", t[e, 0::2].contiguous()
            yield p.format(e=e) + f"up_proj.{kind}", t[e, 1::2].contiguous()
        else:
            yield p.format(e=e) + f"down_proj.{kind}", t[e].contiguous()


# MXFP4's 16 values (E2M1: sign, 2 exponent bits, 1 mantissa bit), by 4-bit code
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_to_float(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """OpenAI's MXFP4 checkpoint tensors -> float32 (..., out, in): blocks uint8 (..., out, G, 16), two 4-bit
    codes a byte (low nibble first), 32 values per group; scales uint8 (..., out, G), E8M0: 2 ** (s - 127)."""
    lut = torch.tensor(_E2M1, dtype=torch.float32)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], 32)  # (..., out, G, 32)
    values = lut[codes.long()] * torch.pow(2.0, scales.to(torch.float32) - 127.0).unsqueeze(-1)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)
