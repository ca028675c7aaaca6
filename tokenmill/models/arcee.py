"""Arcee (AFM-4.5B; HF ArceeForCausalLM, GGUF architecture "arcee"): llama with an ungated MLP, down(relu(up(x))
** 2) (layers/mlp.py, UpDownMLP; HF's hidden_act "relu2"). Its q / k rows are permuted in GGUFs, as llama's.
"""

from __future__ import annotations

from torch import nn

from tokenmill.layers.linear import LinearMethod
from tokenmill.layers.mlp import UpDownMLP
from tokenmill.loader.model_config import ModelConfig
from tokenmill.models.llama import LlamaForCausalLM


class ArceeForCausalLM(LlamaForCausalLM):
    # q / k / v fused as llama's; up_proj stays a module of its own (there is no gate to fuse it with)
    packed_modules_mapping = {k: v for k, v in LlamaForCausalLM.packed_modules_mapping.items()
                              if k not in ("gate_proj", "up_proj")}
    activations = ("relu2",)

    def make_mlp(self, cfg: ModelConfig, method: LinearMethod, layer_idx: int) -> nn.Module:
        return UpDownMLP(cfg.hidden_size, cfg.intermediate_size, method)
