"""Mixture-of-experts decoders (Qwen3-MoE, Qwen2-MoE, Mixtral, Granite MoE, OLMoE, ERNIE 4.5 MoE): the llama
decoder with every layer's MLP a SparseMoE (layers/moe.py; ERNIE's first layer a dense MLP); attention as the
family has it (Qwen3-MoE's q/k norms, Qwen2-MoE's biases, Granite's multipliers (ModelConfig, as for dense
Granite), OLMoE's q / k norms over the whole projection (OLMo 2's attention, models/olmo2.py), ERNIE's rotary
on adjacent pairs (reordered at load)) in llama's pre-norm layer).

Checkpoint names: Qwen's and OLMoE's `mlp.gate` (router), `mlp.experts.N.{gate,up,down}_proj`,
`mlp.shared_expert.*`, `mlp.shared_expert_gate`; Mixtral's `block_sparse_moe.gate`,
`block_sparse_moe.experts.N.w1|w3|w2` (gate, up, down), renamed onto the same modules by
packed_modules_mapping; Granite MoE's `block_sparse_moe.router.layer`, and its experts stacked:
`block_sparse_moe.input_linear` (E, 2I, D: each expert's gate rows then its up rows, our gate_up_proj),
`block_sparse_moe.output_linear` (E, D, I), `shared_mlp.input_linear` / `output_linear` (GraniteMoeShared's
ungated shared expert), split and renamed by checkpoint_renames (loader/weight_loader.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.moe import SparseMoE
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from tokenmill.models.olmo2 import Olmo2Attention


class MoEForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: dict[str, tuple[str, str | None]] = {
        **LlamaForCausalLM.packed_modules_mapping,
        "block_sparse_moe": ("mlp", None), "w1": ("gate_up_proj", "gate"), "w3": ("gate_up_proj", "up"),
        "w2": ("down_proj", None),
    }
    checkpoint_renames: dict[str, str] = {
        "block_sparse_moe.router.layer": "mlp.gate",
        "block_sparse_moe.input_linear": "mlp.experts.{e}.gate_up_proj",
        "block_sparse_moe.output_linear": "mlp.experts.{e}.down_proj",
        "shared_mlp.input_linear": "mlp.shared_expert.gate_up_proj",
        "shared_mlp.output_linear": "mlp.shared_expert.down_proj",
    }

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        if not cfg.num_experts:
            raise ValueError(f"{cfg.architecture}: the config names no experts")
        if layer_idx in cfg.dense_mlp_layers:  # ERNIE 4.5 MoE's first layer
            return LlamaMLP(cfg, method)
        return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         cfg.moe_renormalize, method, cfg.shared_expert_intermediate_size, cfg.shared_expert_gated,
                         cfg.moe_selection_bias)


class OlmoeDecoderLayer(LlamaDecoderLayer):
    attention = Olmo2Attention


class OlmoeForCausalLM(MoEForCausalLM):
    decoder_layer = OlmoeDecoderLayer
    # HF's self_attn.q_norm / k_norm (GGUF attn_q_norm / attn_k_norm) normalize the whole projection (OLMo 2's)
    packed_modules_mapping = MoEForCausalLM.packed_modules_mapping | {
        "q_norm": ("q_norm_full", None), "k_norm": ("k_norm_full", None),
    }


class Ernie45MoeForCausalLM(MoEForCausalLM):
    """ERNIE 4.5 MoE: ERNIE 4.5's attention (rotary on adjacent pairs, reordered at load), dense MLPs in the
    config's dense_mlp_layers, experts chosen by probs + moe_statics' bias and weighed by probs (renormalized),
    and `shared_experts` (HF's name), ungated, beside them."""

    packed_modules_mapping = MoEForCausalLM.packed_modules_mapping | {"shared_experts": ("shared_expert", None)}

    @staticmethod
    def checkpoint_stream(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """HF's `mlp.moe_statics.e_score_correction_bias` (1, E) is our `mlp.moe_statics.bias` (E,)."""
        for name, tensor in weights:
            if name.endswith(".moe_statics.e_score_correction_bias"):
                yield name.replace(".e_score_correction_bias", ".bias"), tensor.reshape(-1)
            else:
                yield name, tensor
