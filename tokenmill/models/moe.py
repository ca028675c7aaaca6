"""Mixture-of-experts decoders (Qwen3-MoE, Qwen2-MoE, Mixtral): the llama decoder with every layer's MLP
a SparseMoE (layers/moe.py); attention as the family has it (Qwen3-MoE's q/k norms, Qwen2-MoE's biases).

Checkpoint names: Qwen's `mlp.gate` (router), `mlp.experts.N.{gate,up,down}_proj`, `mlp.shared_expert.*`,
`mlp.shared_expert_gate`; Mixtral's `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1|w3|w2`
(gate, up, down), renamed onto the same modules by packed_modules_mapping.
"""

from __future__ import annotations

from torch import nn

from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.moe import SparseMoE
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaForCausalLM


class MoEForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: dict[str, tuple[str, str | None]] = {
        **LlamaForCausalLM.packed_modules_mapping,
        "block_sparse_moe": ("mlp", None), "w1": ("gate_up_proj", "gate"), "w3": ("gate_up_proj", "up"),
        "w2": ("down_proj", None),
    }

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod) -> nn.Module:
        if not cfg.num_experts:
            raise ValueError(f"{cfg.architecture}: the config names no experts")
        return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                         cfg.moe_renormalize, method, cfg.shared_expert_intermediate_size)
