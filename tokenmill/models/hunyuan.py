"""Hunyuan dense (HF HunYuanDenseV1ForCausalLM, Hunyuan 0.5B-7B; GGUF architecture "hunyuan-dense"): llama with
per-head q / k RMS norms taken after rotary, not before (ModelConfig.qk_norm_after_rotary, which llama's
attention honours). Its "dynamic" rope with a fixed NTK `alpha` is static: the config reader folds it into the
base, theta * alpha ** (hd / (hd - 2)), as llama.cpp's converter writes freq_base. Checkpoint names:
self_attn.query_layernorm / key_layernorm (GGUF attn_q_norm / attn_k_norm, q / k not permuted).
"""

from __future__ import annotations

from tokenmill.models.llama import LlamaForCausalLM


class HunYuanDenseForCausalLM(LlamaForCausalLM):
    packed_modules_mapping = LlamaForCausalLM.packed_modules_mapping | {
        "query_layernorm": ("q_norm", None), "key_layernorm": ("k_norm", None),
    }
