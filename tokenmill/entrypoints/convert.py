"""`tokenmill convert MODEL OUT_DIR`: write a GGUF model as a Hugging Face fp32 directory.

The directory holds what `transformers` and vLLM need to load the same weights tokenmill serves:

    config.json              the architecture's HF class (loader/architectures.py) and numbers, dtype float32
    model.safetensors        dequantized fp32 tensors under HF parameter names (q/k rows un-permuted)
    tokenizer.json           the `tokenizers` vocabulary tokenmill builds from the GGUF metadata
    tokenizer_config.json    chat template, BOS/EOS/UNK/PAD texts, add_bos_token
    generation_config.json   BOS and end-of-generation ids

Quantized GGUF tensors (e.g. Q4_1) are dequantized exactly as tokenmill's loader does, so a server that
loads the directory computes with the same numbers tokenmill does on the GGUF (up to fp32 rounding).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and the loaders are imported when a conversion runs, not when the CLI parses
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

def hf_rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    """The HF `rope_scaling` entry for a GGUF's rope settings (None: plain RoPE)."""
    rs = cfg.rope_scaling
    if not rs:
        return None
    kind = rs.get("rope_type")
    if kind == "linear":
        return {"rope_type": "linear", "factor": rs["factor"]}
    if kind == "yarn":  # with the ramp's betas and the temperature where the GGUF gave them
        return {"rope_type": "yarn", "factor": rs["factor"],
                "original_max_position_embeddings": rs["original_max_position_embeddings"]} | {
            k: rs[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")
            if rs.get(k) is not None}
    if kind == "longrope":  # phi3: short_factor / long_factor come from the GGUF's tensors (convert_gguf_to_hf)
        out = {"rope_type": "longrope", "original_max_position_embeddings": rs["original_max_position_embeddings"]}
        if rs.get("attention_factor") is not None:
            out["attention_factor"] = rs["attention_factor"]
        return out
    raise NotImplementedError(f"converting a GGUF with rope scaling {rs} to HF format is not supported "
                              "(its per-frequency factors have no lossless HF config form)")


def hf_config(cfg: ModelConfig, tok: Tokenizer) -> dict[str, Any]:
    """config.json for `cfg` in the form transformers and vLLM read."""
    from tokenmill.loader import architectures

    arch = architectures.get(cfg.architecture)
    cls, model_type = arch.hf_classes[0], arch.hf_model_type
    out: dict[str, Any] = {
        "architectures": [cls],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": hf_rope_scaling(cfg),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if cfg.architecture == "gemma3":
        for key in ("hidden_act", "rope_theta", "rope_scaling"):  # its own forms of these follow
            del out[key]
        out.update(_gemma3_config(cfg))
    elif cfg.architecture == "gemma2":
        del out["hidden_act"], out["rope_scaling"]
        out.update(_gemma2_config(cfg))
    elif cfg.sliding_window:  # Mistral's window: every layer
        out["sliding_window"] = cfg.sliding_window
    if model_type == "llama":
        # Llama's attention_bias also adds an o_proj bias, which no GGUF llama we load has
        out.update(attention_bias=cfg.attention_bias, mlp_bias=False)
    elif model_type == "qwen2_moe":
        out["qkv_bias"] = cfg.attention_bias
    elif cfg.attention_bias and model_type not in ("qwen2", "glm4", "gpt_oss"):
        raise NotImplementedError(f"{model_type} with attention biases has no HF config form")
    if model_type == "phi3":
        out.update(_phi3_config(cfg))
    elif model_type in ("granite", "granitemoe"):
        out.update(embedding_multiplier=cfg.embedding_multiplier, residual_multiplier=cfg.residual_multiplier,
                   attention_multiplier=cfg.attention_multiplier or cfg.head_dim ** -0.5,
                   logits_scaling=cfg.logits_scaling)
    elif model_type == "gemma":  # its embedding scale is implied by the class
        out["hidden_act"] = cfg.hidden_act
    elif model_type == "cohere2":
        out.update(logit_scale=1.0 / cfg.logits_scaling, sliding_window=cfg.sliding_window,
                   layer_norm_eps=cfg.rms_norm_eps, layer_types=list(cfg.layer_types) if cfg.sliding_window
                   else ["full_attention"] * cfg.num_layers)
    elif model_type == "ministral3":  # its temperature rides in the rope entry, as HF's config keeps it
        if cfg.attn_temperature_scale:
            if not out["rope_scaling"]:
                raise NotImplementedError("ministral3 with an attention temperature but no YaRN has no HF form")
            out["rope_scaling"] |= {"llama_4_scaling_beta": cfg.attn_temperature_scale,
                                    "original_max_position_embeddings": cfg.attn_temperature_length}
        out["sliding_window"] = cfg.sliding_window
    elif model_type == "arcee":
        out["hidden_act"] = cfg.hidden_act
    elif model_type == "glm4":
        out["partial_rotary_factor"] = (cfg.rotary_dim or cfg.head_dim) / cfg.head_dim
        out["attention_bias"] = cfg.attention_bias
        out["pad_token_id"] = None  # its config class defaults to 151329, past a smaller vocabulary
    elif model_type == "exaone4":  # layer_types always (its config cannot derive them without a window)
        out["sliding_window"] = cfg.sliding_window
        out["layer_types"] = list(cfg.layer_types) if cfg.sliding_window else ["full_attention"] * cfg.num_layers
    elif model_type == "gpt_oss":  # q/k/v/o biases always; its YaRN keeps truncate (False) in rope_scaling
        out.update(attention_bias=True, sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types),
                   swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit)
    elif model_type == "olmo3":  # its windowed layers' base must be the global one (no separate HF field)
        if cfg.rope_local_theta and cfg.rope_local_theta != cfg.rope_theta:
            raise NotImplementedError("olmo3 with another rotary base on its windowed layers has no HF config form")
        out.update(sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types))
        # transformers 5's entry per layer type (from a top-level rope_theta it would give the windowed layers
        # its default base instead)
        full = dict(out.pop("rope_scaling") or {"rope_type": "default"}) | {"rope_theta": out.pop("rope_theta")}
        out["rope_parameters"] = {"full_attention": full,
                                  "sliding_attention": {"rope_type": "default", "rope_theta": full["rope_theta"]}}
    elif model_type in ("qwen3_5_text", "qwen3_5_moe_text"):
        out.update(_qwen3_5_config(cfg, out))
    elif model_type == "lfm2":  # the MLP's width as it is (not adjusted again), its own names for the rest
        if out["rope_scaling"]:
            raise NotImplementedError("lfm2 with rope scaling has no HF config form")
        out.update(layer_types=list(cfg.layer_types), conv_L_cache=cfg.linear_conv_kernel, conv_bias=False,
                   norm_eps=cfg.rms_norm_eps, block_auto_adjust_ff_dim=False, pad_token_id=None)
    elif model_type == "lfm2_moe":  # LFM2's names; its dense MLP's width is taken as it is
        if out["rope_scaling"]:
            raise NotImplementedError("lfm2_moe with rope scaling has no HF config form")
        out.update(layer_types=list(cfg.layer_types), conv_L_cache=cfg.linear_conv_kernel, conv_bias=False,
                   norm_eps=cfg.rms_norm_eps, pad_token_id=None)
    elif model_type == "granitemoehybrid":
        out.update(_granite_hybrid_config(cfg, out))
    elif model_type == "smollm3":
        out["no_rope_layers"] = [int(i not in cfg.nope_layers) for i in range(cfg.num_layers)]
        out["pad_token_id"] = None  # its config class defaults to 128004, past a smaller vocabulary
    out.update(_hf_moe_config(cfg, model_type))
    if model_type == "granitemoe" and cfg.shared_expert_intermediate_size:  # the shared expert's own class
        out.update(architectures=[arch.hf_classes[1]], model_type="granitemoeshared")
    if cfg.name:
        out["_name_or_path"] = cfg.name
    return out


def _phi3_config(cfg: ModelConfig) -> dict[str, Any]:
    """Phi3ForCausalLM's own config.json entries: partial rotary, the window, the original context."""
    out: dict[str, Any] = {"partial_rotary_factor": (cfg.rotary_dim or cfg.head_dim) / cfg.head_dim,
                           "sliding_window": cfg.sliding_window}
    if cfg.rope_scaling:
        out["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    return out


def _phi3_tensors(tensors: dict[str, Any], config: dict[str, Any]) -> None:
    """In place: GGUF's longrope factor tensors into config.json's rope_scaling; separate q/k/v (which
    llama.cpp's phi3 also accepts) fused into HF's qkv_proj."""
    import torch

    for key in ("short_factor", "long_factor"):
        factors = tensors.pop(f"rope_factors_{key.split('_')[0]}", None)
        if factors is not None:
            config["rope_scaling"][key] = [float(f) for f in factors.flatten()]
    if config["rope_scaling"] and {"short_factor", "long_factor"} - set(config["rope_scaling"]):
        raise ValueError("GGUF phi3 longrope needs both rope_factors_short and rope_factors_long")
    for name in [n for n in tensors if n.endswith("self_attn.q_proj.weight")]:
        parts = [tensors.pop(name.replace("q_proj", p)) for p in ("q_proj", "k_proj", "v_proj")]
        tensors[name.replace("q_proj", "qkv_proj")] = torch.cat(parts, dim=0)


def _granitemoe_tensors(tensors: dict[str, Any], num_experts: int) -> None:
    """In place: the experts' matrices stacked as Granite MoE's checkpoints hold them (block_sparse_moe's
    router.layer, input_linear (E, 2I, D) with each expert's gate rows before its up rows, output_linear
    (E, D, I)), and the shared expert as shared_mlp's input_linear / output_linear."""
    import torch

    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        p = name[: -len("mlp.gate.weight")]
        tensors[p + "block_sparse_moe.router.layer.weight"] = tensors.pop(name)
        experts = [p + f"mlp.experts.{e}." for e in range(num_experts)]
        tensors[p + "block_sparse_moe.input_linear.weight"] = torch.stack(
            [torch.cat([tensors.pop(x + "gate_proj.weight"), tensors.pop(x + "up_proj.weight")]) for x in experts])
        tensors[p + "block_sparse_moe.output_linear.weight"] = torch.stack(
            [tensors.pop(x + "down_proj.weight") for x in experts])
        if p + "mlp.shared_expert.gate_proj.weight" in tensors:
            s = p + "mlp.shared_expert."
            tensors[p + "shared_mlp.input_linear.weight"] = torch.cat([tensors.pop(s + "gate_proj.weight"),
                                                                       tensors.pop(s + "up_proj.weight")])
            tensors[p + "shared_mlp.output_linear.weight"] = tensors.pop(s + "down_proj.weight")


def _granite_hybrid_config(cfg: ModelConfig, out: dict[str, Any]) -> dict[str, Any]:
    """GraniteMoeHybridConfig's fields: the multipliers, layer types, rotary on every attention layer or none, the
    Mamba2 shapes; a dense model (Micro) as the shared MLP alone (num_local_experts 0)."""
    if out["rope_scaling"]:
        raise NotImplementedError("granitemoehybrid with rope scaling has no HF config form")
    attn = set(cfg.kv_layers)
    if not attn.issubset(cfg.nope_layers) and attn & set(cfg.nope_layers):
        raise NotImplementedError("granitemoehybrid with rotary on some attention layers only has no HF config form")
    inner = cfg.linear_value_dim_mamba
    if inner % cfg.hidden_size:
        raise NotImplementedError("granitemoehybrid with d_inner not a multiple of the hidden size has no HF form")
    fields: dict[str, Any] = dict(
        embedding_multiplier=cfg.embedding_multiplier, residual_multiplier=cfg.residual_multiplier,
        attention_multiplier=cfg.attention_multiplier or cfg.head_dim ** -0.5, logits_scaling=cfg.logits_scaling,
        layer_types=["mamba" if t == "mamba" else "attention" for t in cfg.layer_types],
        position_embedding_type="nope" if attn & set(cfg.nope_layers) else "rope",
        mamba_n_heads=cfg.linear_num_value_heads, mamba_n_groups=cfg.linear_num_key_heads,
        mamba_d_state=cfg.linear_value_head_dim, mamba_d_head=cfg.linear_key_head_dim,
        mamba_d_conv=cfg.linear_conv_kernel, mamba_expand=inner // cfg.hidden_size, mamba_conv_bias=True,
        mamba_proj_bias=False, pad_token_id=None)
    if not cfg.num_experts:  # the dense MLP is the shared one
        fields.update(num_local_experts=0, shared_intermediate_size=cfg.intermediate_size)
    return fields


def _granite_hybrid_tensors(tensors: dict[str, Any], cfg: ModelConfig) -> None:
    """In place: the Mamba2 layers' tensors as HF holds them (A_log from ssm_a = -exp(A_log), dt_bias, D and the
    gated norm flat, the conv (C, 1, K), a zero conv bias where the GGUF has none), and the MLPs as Granite MoE's
    stacked experts and shared_mlp (the dense one too)."""
    import torch

    for name in [n for n in tensors if n.endswith(".mamba.ssm_a")]:
        p = name[: -len("ssm_a")]
        tensors[p + "A_log"] = torch.log(-tensors.pop(name)).reshape(-1)
        tensors[p + "dt_bias"] = tensors.pop(p + "ssm_dt.bias").reshape(-1)
        tensors[p + "D"] = tensors[p + "D"].reshape(-1)
        tensors[p + "norm.weight"] = tensors[p + "norm.weight"].reshape(-1)
        conv = tensors[p + "conv1d.weight"]
        tensors[p + "conv1d.weight"] = conv.reshape(conv.shape[0], 1, -1).contiguous()
        tensors.setdefault(p + "conv1d.bias", torch.zeros(conv.shape[0]))
    if cfg.num_experts:
        _granitemoe_tensors(tensors, cfg.num_experts)
        return
    for name in [n for n in tensors if n.endswith(".mlp.gate_proj.weight")]:
        p = name[: -len("mlp.gate_proj.weight")]
        tensors[p + "shared_mlp.input_linear.weight"] = torch.cat([tensors.pop(name),
                                                                  tensors.pop(p + "mlp.up_proj.weight")])
        tensors[p + "shared_mlp.output_linear.weight"] = tensors.pop(p + "mlp.down_proj.weight")


def _gpt_oss_tensors(tensors: dict[str, Any], num_experts: int) -> None:
    """In place: the sinks under their HF name, the router as mlp.router, and the experts stacked as
    transformers' GptOss holds them: gate_up_proj (E, D, 2I) with gate and up in alternating columns (x @ w),
    gate_up_proj_bias (E, 2I) alike, down_proj (E, I, D), down_proj_bias (E, D)."""
    import torch

    for name in [n for n in tensors if n.endswith(".self_attn.sinks.weight")]:
        tensors[name[: -len(".weight")]] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        p = name[: -len("gate.weight")]
        for kind in ("weight", "bias"):
            tensors[p + f"router.{kind}"] = tensors.pop(p + f"gate.{kind}")
        experts = [p + f"experts.{e}." for e in range(num_experts)]

        def alternate(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # (I, ...) twice -> (2I, ...)
            return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], *gate.shape[1:])

        tensors[p + "experts.gate_up_proj"] = torch.stack(
            [alternate(tensors.pop(x + "gate_proj.weight"), tensors.pop(x + "up_proj.weight")).t() for x in experts])
        tensors[p + "experts.gate_up_proj_bias"] = torch.stack(
            [alternate(tensors.pop(x + "gate_proj.bias"), tensors.pop(x + "up_proj.bias")) for x in experts])
        tensors[p + "experts.down_proj"] = torch.stack([tensors.pop(x + "down_proj.weight").t() for x in experts])
        tensors[p + "experts.down_proj_bias"] = torch.stack([tensors.pop(x + "down_proj.bias") for x in experts])


def _hf_moe_config(cfg: ModelConfig, model_type: str) -> dict[str, Any]:
    """The experts' entries of config.json (none for a dense model)."""
    if not cfg.num_experts:
        return {}
    if model_type in ("mixtral", "granitemoe", "gpt_oss", "granitemoehybrid"):
        if not cfg.moe_renormalize:
            raise NotImplementedError(f"{model_type} without renormalized expert weights has no HF config form")
        local: dict[str, Any] = {"num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                                 "intermediate_size": cfg.moe_intermediate_size}
        if cfg.shared_expert_intermediate_size:
            if model_type not in ("granitemoe", "granitemoehybrid") or cfg.shared_expert_gated:
                raise NotImplementedError(f"{model_type} with this shared expert has no HF config form")
            local["shared_intermediate_size"] = cfg.shared_expert_intermediate_size
        return local
    if model_type == "ernie4_5_moe":  # its own names; dense layers only as a leading run (moe_layer_start_index)
        lead = len(cfg.dense_mlp_layers)
        if cfg.dense_mlp_layers != tuple(range(lead)) or not cfg.moe_selection_bias or cfg.shared_expert_gated:
            raise NotImplementedError("ernie4_5_moe with these dense layers or experts has no HF config form")
        shared, inter = cfg.shared_expert_intermediate_size, cfg.moe_intermediate_size
        if shared % inter:
            raise NotImplementedError("ernie4_5_moe shared experts not a whole number of experts' size")
        return {"moe_num_experts": cfg.num_experts, "moe_k": cfg.num_experts_per_tok, "moe_intermediate_size": inter,
                "moe_num_shared_experts": shared // inter, "moe_layer_start_index": lead,
                "moe_layer_end_index": cfg.num_layers - 1, "moe_layer_interval": 1, "use_bias": False}
    if model_type == "lfm2_moe":  # sigmoid scores only; dense layers only as a leading run (num_dense_layers)
        lead = len(cfg.dense_mlp_layers)
        if cfg.dense_mlp_layers != tuple(range(lead)) or not cfg.moe_sigmoid or cfg.shared_expert_intermediate_size:
            raise NotImplementedError("lfm2_moe with these dense layers or experts has no HF config form")
        return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.moe_renormalize,
                "use_expert_bias": cfg.moe_selection_bias, "routed_scaling_factor": cfg.moe_routed_scaling,
                "num_dense_layers": lead}
    if model_type == "olmoe":  # its intermediate_size is each expert's
        return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                "intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.moe_renormalize}
    out: dict[str, Any] = {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
                           "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": cfg.moe_renormalize,
                           "decoder_sparse_step": 1, "mlp_only_layers": []}
    if model_type == "qwen3_5_moe_text" and not cfg.moe_renormalize:
        raise NotImplementedError("qwen3_5_moe without renormalized expert weights has no HF config form")
    if model_type in ("qwen2_moe", "qwen3_5_moe_text"):
        if not cfg.shared_expert_intermediate_size:
            raise NotImplementedError(f"{model_type} without a shared expert has no HF config form")
        out["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
    return out


def _qwen3_5_config(cfg: ModelConfig, out: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's fields: layer types, the linear-attention shapes, rotary in rope_parameters (transformers 5's
    form, with the partial factor); the MoE's config has no dense MLP."""
    if out.pop("rope_scaling"):
        raise NotImplementedError("qwen3_5 with rope scaling has no HF config form")
    if cfg.num_experts:
        del out["intermediate_size"]
    return {"layer_types": list(cfg.layer_types), "linear_num_key_heads": cfg.linear_num_key_heads,
            "linear_num_value_heads": cfg.linear_num_value_heads, "linear_key_head_dim": cfg.linear_key_head_dim,
            "linear_value_head_dim": cfg.linear_value_head_dim, "linear_conv_kernel_dim": cfg.linear_conv_kernel,
            "attention_bias": cfg.attention_bias, "pad_token_id": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": out.pop("rope_theta"),
                                "partial_rotary_factor": (cfg.rotary_dim or cfg.head_dim) / cfg.head_dim}}


def _qwen3_5_tensors(tensors: dict[str, Any], cfg: ModelConfig) -> None:
    """A Qwen3.5 GGUF's tensors in transformers' form: A_log from ssm_a (-exp(A_log)), dt_bias, the conv as
    (C, 1, K), and the value heads back from llama.cpp's tiled order to grouped (every tensor that has them)."""
    import torch

    hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    qk = 2 * hk * dk

    def grouped(t: torch.Tensor, dim: int, width: int) -> torch.Tensor:
        if not cfg.linear_v_heads_tiled:
            return t
        t = t.movedim(dim, 0)
        rest = t.shape[1:]  # (r Hk + kh) -> (kh R + r)
        t = t.reshape(-1, hk, width, *rest).transpose(0, 1).reshape(-1, *rest)
        return t.movedim(0, dim).contiguous()

    for name in [n for n in tensors if ".linear_attn." in n]:
        t = tensors.pop(name)
        if name.endswith(".ssm_a"):
            name, t = name[: -len("ssm_a")] + "A_log", torch.log(-t)
        elif name.endswith(".ssm_dt.bias"):
            name = name[: -len("ssm_dt.bias")] + "dt_bias"
        if name.endswith(("A_log", "dt_bias", "in_proj_a.weight", "in_proj_b.weight")):
            t = grouped(t, 0, 1)
        elif name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            t = torch.cat([t[:qk], grouped(t[qk:], 0, dv)])
            if name.endswith("conv1d.weight"):
                t = t.reshape(t.shape[0], 1, -1)
        elif name.endswith("in_proj_z.weight"):
            t = grouped(t, 0, dv)
        elif name.endswith("out_proj.weight"):
            t = grouped(t, 1, dv)
        tensors[name] = t


def _gemma_config(cfg: ModelConfig) -> dict[str, Any]:
    """The fields Gemma2Config and Gemma3TextConfig share."""
    return {
        "hidden_activation": cfg.hidden_act,
        "query_pre_attn_scalar": int(cfg.query_pre_attn_scalar) if cfg.query_pre_attn_scalar.is_integer()
        else cfg.query_pre_attn_scalar,  # the configs want an int
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "final_logit_softcapping": cfg.final_logit_softcapping or None,
        "attn_logit_softcapping": cfg.attn_logit_softcapping or None,
        "attention_bias": cfg.attention_bias,
    }


def _gemma3_config(cfg: ModelConfig) -> dict[str, Any]:
    """Gemma3TextConfig's own fields (transformers 5 form: per-layer-type rope parameters)."""
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if (scaling := hf_rope_scaling(cfg)) is not None:
        full.update(scaling)
    return {**_gemma_config(cfg),
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta}}}


def _gemma2_config(cfg: ModelConfig) -> dict[str, Any]:
    """Gemma2Config's own fields (rope_theta stays the common one: one base for every layer)."""
    if cfg.rope_scaling:
        raise NotImplementedError("gemma2 with rope scaling has no HF config form")
    return _gemma_config(cfg)


def hf_tokenizer_files(tok: Tokenizer, md: dict[str, Any], max_len: int) -> tuple[str, dict[str, Any]]:
    """(tokenizer.json text, tokenizer_config.json dict) for tokenmill's GGUF tokenizer."""
    from tokenizers.processors import TemplateProcessing

    backend = tok.backend
    if tok.add_bos and tok.bos_token is not None:
        # tokenmill prepends BOS in Python; an HF tokenizer does it in its post-processor
        backend.post_processor = TemplateProcessing(
            single=f"{tok.bos_token} $A", pair=f"{tok.bos_token} $A {tok.bos_token} $B:1",
            special_tokens=[(tok.bos_token, tok.bos_token_id)])

    def text(key: str) -> str | None:
        i = md.get(key)
        return backend.id_to_token(int(i)) if i is not None and int(i) < tok.vocab_size else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "unk_token": text("tokenizer.ggml.unknown_token_id"),
        "pad_token": text("tokenizer.ggml.padding_token_id"),
        "add_bos_token": tok.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
    }
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    return backend.to_str(), {k: v for k, v in config.items() if v is not None}


def convert_gguf_to_hf(model: str, out_dir: str | Path, progress: bool = True) -> Path:
    """Write the GGUF `model` ('default' or a path) as an HF fp32 directory; returns the directory."""
    import torch
    from safetensors.torch import save_file

    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.loader.model_source import resolve_model
    from tokenmill.loader.weights import INTERLEAVED_ROTARY, gguf_weights, interleaved_qk_rows
    from tokenmill.tokenizer.tokenizer import Tokenizer

    source = resolve_model(model)
    if source.kind != "gguf":
        raise ValueError(f"{model} is already an HF-style directory; convert reads a .gguf file")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gf = GGUFFile(source.path)
    try:
        md = dict(gf.metadata)
        cfg = ModelConfig.from_gguf(md, set(gf.tensors), gf.quantization())
        tok = Tokenizer.from_gguf(md)
        config = hf_config(cfg, tok)  # fails early on what HF cannot express
        tensors: dict[str, torch.Tensor] = {}
        for name, w in gguf_weights(gf, cfg, progress=progress):
            if name == "rope_freqs":
                raise NotImplementedError("GGUF rope_freqs tensors have no HF equivalent")
            assert isinstance(w, torch.Tensor)  # nothing asked to stay quantized
            if cfg.architecture in INTERLEAVED_ROTARY:  # back to the family's own adjacent-pair rows
                w = interleaved_qk_rows(name, w, cfg, to_halves=False)
            tensors[name] = w.to(torch.float32).contiguous()
    finally:
        gf.close()
    if cfg.architecture == "phi3":
        _phi3_tensors(tensors, config)
    elif cfg.architecture == "hunyuan_dense":  # its own names for the q / k norms
        for ours, theirs in (("q_norm", "query_layernorm"), ("k_norm", "key_layernorm")):
            for name in [n for n in tensors if f".self_attn.{ours}." in n]:
                tensors[name.replace(f".{ours}.", f".{theirs}.")] = tensors.pop(name)
    elif cfg.architecture == "granitemoe":
        _granitemoe_tensors(tensors, cfg.num_experts)
    elif cfg.architecture == "gpt_oss":
        _gpt_oss_tensors(tensors, cfg.num_experts)
    elif cfg.architecture in ("granite_hybrid", "granite_hybrid_moe"):
        _granite_hybrid_tensors(tensors, cfg)
    elif cfg.architecture in ("qwen3_5", "qwen3_5_moe"):
        _qwen3_5_tensors(tensors, cfg)
    elif cfg.architecture in ("lfm2", "lfm2_moe"):  # the conv as (C, 1, K); LFM2-MoE's selection bias's own name
        for name in [n for n in tensors if n.endswith(".conv.conv.weight")]:
            tensors[name] = tensors[name].unsqueeze(1).contiguous()
        for name in [n for n in tensors if n.endswith(".feed_forward.moe_statics.bias")]:
            tensors[name.replace(".moe_statics.bias", ".expert_bias")] = tensors.pop(name)
    elif cfg.architecture == "ernie4_5_moe":  # its shared experts' and selection bias's own names
        for name in list(tensors):
            if ".mlp.shared_expert." in name:
                tensors[name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")] = tensors.pop(name)
            elif name.endswith(".mlp.moe_statics.bias"):
                tensors[name[: -len("bias")] + "e_score_correction_bias"] = tensors.pop(name)[None]
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"),
              metadata={"format": "pt", "source": source.path.name, "quantization": cfg.quantization})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_json, tok_config = hf_tokenizer_files(tok, md, cfg.max_position_embeddings)
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    eos_ids = sorted(tok.eog_token_ids)
    gen = {"bos_token_id": tok.bos_token_id,
           "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else ([tok.eos_token_id] + [i for i in eos_ids
                                                                                    if i != tok.eos_token_id])}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    logger.info("wrote %s (%d tensors, fp32, from %s %s)", out, len(tensors), source.path.name, cfg.quantization)
    return out


def add_convert_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `tokenmill convert` on the CLI's subparsers."""
    p = sub.add_parser("convert", help="write a GGUF model as an HF-format fp32 directory (for transformers/vLLM)")
    p.add_argument("model", help="a .gguf file or 'default'")
    p.add_argument("out_dir", help="the directory to write (created if missing)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    out = convert_gguf_to_hf(args.model, args.out_dir)
    print(out)
    return 0
