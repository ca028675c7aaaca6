"""Weight readers: yield (HF parameter name, tensor) pairs; the model's parameters decide what to do with them.

The GGUF reader renames llama.cpp's tensors to the HF names of the model's family (and undoes its q/k row
permutation for the llama architecture, Mixtral included; one 3-D expert tensor becomes one matrix per
expert); with `keep_quantized` it hands the chosen tensors through as their raw GGUF blocks
(`GGUFQuantized`), untouched by dequantisation, for a linear method that computes on them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from gguf import GGMLQuantizationType

from tokenmill.loader.gguf import GGUFFile, TensorInfo
from tokenmill.loader.model_config import ModelConfig
from tokenmill.loader.model_source import ModelSource


@dataclass
class GGUFQuantized:
    """A GGUF tensor as stored: `data` (rows, bytes_per_row) uint8 blocks of `ggml_type` (a
    gguf.GGMLQuantizationType), for a weight of `shape` (PyTorch order, e.g. (out, in)).

    `data` is a read-only view of the file's mmap (zero copy; it keeps the mapping alive), or a copy where
    rows had to be permuted. A consumer that copies the bytes elsewhere (repacking) calls `release()` so
    the file's pages leave this process's memory."""

    data: np.ndarray
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    release: Callable[[], None] = lambda: None

    @property
    def type_name(self) -> str:
        return self.ggml_type.name.lower()

_GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
# Mixture-of-experts tensors, by family: a 3-D `*_exps` tensor is num_experts stacked (out, in) matrices,
# yielded one per expert under the HF name with {e} filled in.
_GGUF_TO_HF_QWEN_MOE = {
    "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj", "ffn_down_exps": "mlp.experts.{e}.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
_GGUF_TO_HF_MOE = {
    "qwen3moe": _GGUF_TO_HF_QWEN_MOE, "qwen2moe": _GGUF_TO_HF_QWEN_MOE, "olmoe": _GGUF_TO_HF_QWEN_MOE,
    # Granite MoE: llama.cpp splits HF's stacked input_linear into gate and up, its shared_mlp into *_shexp
    "granitemoe": _GGUF_TO_HF_QWEN_MOE,
    "gpt_oss": _GGUF_TO_HF_QWEN_MOE,  # each expert tensor with a 2-D bias beside it (blk.N.ffn_up_exps.bias)
    # ERNIE 4.5 MoE: its selection bias, exp_probs_b.bias, (E,)
    "ernie4_5_moe": _GGUF_TO_HF_QWEN_MOE | {"exp_probs_b": "mlp.moe_statics"},
    "qwen3_5_moe": _GGUF_TO_HF_QWEN_MOE,
    # LFM2-MoE: HF's feed_forward names (w1 gate, w3 up, w2 down); its selection bias exp_probs_b.bias, (E,)
    "lfm2_moe": {"ffn_gate_inp": "feed_forward.gate", "ffn_gate_exps": "feed_forward.experts.{e}.w1",
                 "ffn_up_exps": "feed_forward.experts.{e}.w3", "ffn_down_exps": "feed_forward.experts.{e}.w2",
                 "exp_probs_b": "feed_forward.moe_statics"},
    "granite_hybrid_moe": _GGUF_TO_HF_QWEN_MOE,  # as Granite MoE's: experts split, the shared MLP as *_shexp
    "mixtral": {"ffn_gate_inp": "block_sparse_moe.gate", "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
                "ffn_up_exps": "block_sparse_moe.experts.{e}.w3", "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"},
}
# where an architecture's tensor holds something else under the same name
_GGUF_TO_HF_BY_ARCH = {
    # q|k|v rows in one tensor (not permuted: llama.cpp's phi3 rotary is NeoX-style, like HF), and gate|up
    # rows in ffn_up (llama.cpp's swiglu takes the first half as the gate), as HF's qkv_proj / gate_up_proj
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    # Gemma 3: four norms per layer (llama.cpp's ffn_norm is the one before the MLP)
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
}
_GGUF_TO_HF_BY_ARCH["gemma2"] = _GGUF_TO_HF_BY_ARCH["gemma3"]  # the same four norms
# OLMo 2: a norm after each sublayer and none before
_GGUF_TO_HF_BY_ARCH["olmo2"] = {"post_attention_norm": "post_attention_layernorm",
                                "post_ffw_norm": "post_feedforward_layernorm"}
_GGUF_TO_HF_BY_ARCH["exaone4"] = _GGUF_TO_HF_BY_ARCH["olmo2"]  # the same two norms
_GGUF_TO_HF_BY_ARCH["olmo3"] = _GGUF_TO_HF_BY_ARCH["olmo2"]
# GLM-4: gate|up rows in ffn_up (as phi3's), a norm after each sublayer besides llama's two before them
_GGUF_TO_HF_BY_ARCH["glm4"] = {"ffn_up": "mlp.gate_up_proj", "post_attention_norm": "post_self_attn_layernorm",
                               "post_ffw_norm": "post_mlp_layernorm"}
# gpt-oss: post_attention_norm is the norm before the MLP (HF's post_attention_layernorm); the sinks, (nh,) a
# layer, reach the model's load_extra_weight as self_attn.sinks.weight
_GGUF_TO_HF_BY_ARCH["gpt_oss"] = {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"}
# Qwen3.5: post_attention_norm is the norm before the MLP; a linear-attention layer's tensors under HF's names but
# for ssm_a (-exp(A_log)) and ssm_dt's bias (dt_bias), which the model's checkpoint_stream turns back
_GGUF_TO_HF_BY_ARCH["qwen3_5"] = {
    "post_attention_norm": "post_attention_layernorm", "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z", "ssm_alpha": "linear_attn.in_proj_a", "ssm_beta": "linear_attn.in_proj_b",
    "ssm_a": "linear_attn.ssm_a", "ssm_dt": "linear_attn.ssm_dt", "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj"}
_GGUF_TO_HF_BY_ARCH["qwen3_5_moe"] = _GGUF_TO_HF_BY_ARCH["qwen3_5"]
# LFM2: HF's names (operator_norm, feed_forward's w1 / w3 / w2, the attention's out_proj and q / k layernorms); a
# conv layer's shortconv tensors, the conv squeezed to (C, K); its final norm is token_embd_norm (_hf_name)
_GGUF_TO_HF_BY_ARCH["lfm2"] = {
    "attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm", "attn_k_norm": "self_attn.k_layernorm",
    "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
    "shortconv.conv": "conv.conv", "shortconv.in_proj": "conv.in_proj", "shortconv.out_proj": "conv.out_proj"}
_GGUF_TO_HF_BY_ARCH["lfm2_moe"] = _GGUF_TO_HF_BY_ARCH["lfm2"]  # (its experts: _GGUF_TO_HF_MOE)
# Granite 4.0-H: a Mamba2 layer's ssm_* tensors under HF's names but for ssm_a (-exp(A_log), (H, 1)), ssm_dt's bias
# (dt_bias), ssm_d (D, (H, 1)) and ssm_norm (n_groups, d_inner / n_groups), which the model's checkpoint_stream
# turns back; a dense MLP (Micro) as ffn_gate / ffn_up / ffn_down
_GGUF_TO_HF_BY_ARCH["granite_hybrid"] = {
    "ssm_in": "mamba.in_proj", "ssm_conv1d": "mamba.conv1d", "ssm_dt": "mamba.ssm_dt", "ssm_a": "mamba.ssm_a",
    "ssm_d": "mamba.D", "ssm_norm": "mamba.norm", "ssm_out": "mamba.out_proj"}
_GGUF_TO_HF_BY_ARCH["granite_hybrid_moe"] = _GGUF_TO_HF_BY_ARCH["granite_hybrid"]
# GGUF tensors that are not parameters, for the model's load_extra_weight (rope_freqs: llama3's factors;
# rope_factors_*: phi3's longrope factors)
_GGUF_EXTRAS = {"rope_freqs.weight": "rope_freqs", "rope_factors_long.weight": "rope_factors_long",
                "rope_factors_short.weight": "rope_factors_short"}


# Families whose rotary pairs adjacent dims of a head (2i, 2i + 1: GPT-J style) in their own checkpoints, where
# ours pairs i with i + hd / 2 (NeoX style). llama.cpp keeps their q / k rows as they are (its "norm" rotary
# pairs adjacent dims), so in both formats the rows are in the layout llama.cpp's converter gives llama's
# permuted ones, and the same un-permutation (_unpermute) puts each head's even dims before its odd ones: q.k
# is unchanged by reordering both alike, and the rotation is then ours. Under partial rotary (GLM-4) only each
# head's rotating dims are reordered (_to_halves).
INTERLEAVED_ROTARY = ("ernie4_5", "ernie4_5_moe", "glm4", "cohere2")


def _norm_shift(gguf_arch: str, name: str) -> float:
    """What llama.cpp's converter added to a norm weight: 1 for Gemma 1, 2 and 3 and Qwen3.5, whose (1 + w) norms it
    stores as the scale itself (convert_hf_to_gguf.py, Gemma2Model and Gemma3Model, Qwen3NextModel). The reader takes it off again, so
    every reader yields the HF checkpoint's w."""
    if gguf_arch in ("qwen35", "qwen35moe") and name.endswith("norm.weight") and not name.endswith("ssm_norm.weight"):
        return 1.0  # Qwen3.5's (1 + w) norms, but the gated one in its linear attention (Qwen3NextModel)
    return 1.0 if gguf_arch in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight") else 0.0


def _unpermute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's row permutation of q/k (its rotary pairs adjacent dims; HF pairs halves); numpy or torch."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _permute(w: Any, n_head: int) -> Any:
    """llama.cpp's row permutation of q/k (HF's halves -> adjacent pairs): _unpermute's inverse."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _to_halves(w: Any, n_head: int, cfg: ModelConfig, back: bool = False) -> Any:
    """q or k rows (numpy or torch, weights or bias, n_head heads of cfg.head_dim rows): each head's rotating
    rows (its first cfg.rotary_dim, all unless partial) from adjacent pairs into halves (_unpermute), or back
    (`back`: _permute); the rest of each head as it is."""
    hd = cfg.head_dim
    rd = cfg.rotary_dim or hd
    if rd == hd:
        return _permute(w, n_head) if back else _unpermute(w, n_head)
    shape, rest = w.shape, w.shape[1:]
    heads = w.reshape(n_head, hd, *rest)
    rot = heads[:, :rd].reshape(n_head * rd, *rest)
    rot = (_permute(rot, n_head) if back else _unpermute(rot, n_head)).reshape(n_head, rd, *rest)
    cat = torch.cat if isinstance(w, torch.Tensor) else np.concatenate
    return cat([rot, heads[:, rd:]], 1).reshape(shape)


KeepQuantized = Callable[[str, TensorInfo], bool]


def gguf_weights(gf: GGUFFile, cfg: ModelConfig, progress: bool = True,
                 keep_quantized: KeepQuantized | None = None) -> Iterator[tuple[str, torch.Tensor | GGUFQuantized]]:
    """(HF name, fp32 tensor) for each tensor; (HF name, GGUFQuantized) where keep_quantized(HF name,
    tensor info) says so."""
    # llama.cpp's converter permutes q/k for the llama arch and the ones it converts as llama (LlamaModel's
    # subclasses that keep its rotary: Granite, Granite MoE, Granite 4.0-H, SmolLM3, Arcee, Ministral 3)
    permuted = gf.architecture in ("llama", "granite", "granitemoe", "granitehybrid", "smollm3", "arcee", "mistral3", "ernie4_5-moe",
                                   *INTERLEAVED_ROTARY)
    for name in tqdm(list(gf.tensors), desc="Loading weights", unit="tensor", disable=not progress, leave=False):
        if (m := re.match(r"blk\.(\d+)\.", name)) and int(m.group(1)) >= cfg.num_layers:
            continue  # a multi-token-prediction layer past the model's (nextn_predict_layers): not run here
        hf_name, n_head = _hf_name(name, cfg, permuted)
        info = gf.tensors[name]
        if "{e}" in hf_name:
            yield from _expert_weights(gf, info, hf_name, keep_quantized)
            continue
        if keep_quantized is not None and keep_quantized(hf_name, info):
            raw = gf.raw(name)  # (rows, bytes per row), a view: whole rows permute like dequantised ones
            release: Callable[[], None] = functools.partial(gf.release, info.offset, info.num_bytes)
            if n_head:
                raw = np.ascontiguousarray(_to_halves(raw, n_head, cfg))  # a copy: the file's pages can go
                release()
                release = nothing
            yield hf_name, GGUFQuantized(raw, info.ggml_type, info.shape, release)
            continue
        w = gf.load(name)
        if n_head:
            w = _to_halves(w, n_head, cfg)
        if hf_name.endswith("shared_expert_gate.weight") and w.ndim == 1:  # llama.cpp's (d,) for HF's (1, d)
            w = w[None]
        if shift := _norm_shift(gf.architecture, name):
            w = w.astype(np.float32) - np.float32(shift)
        yield hf_name, torch.from_numpy(np.ascontiguousarray(w))


def _expert_weights(gf: GGUFFile, info: TensorInfo, template: str, keep_quantized: KeepQuantized | None,
                    ) -> Iterator[tuple[str, torch.Tensor | GGUFQuantized]]:
    """A (num_experts, out, in) tensor as one (out, in) matrix per expert: its raw rows sliced (no copy)
    where kept quantized, else dequantized."""
    num_experts, out = info.shape[0], info.shape[1]
    if keep_quantized is not None and keep_quantized(template, info):
        raw = gf.raw(info.name)  # (num_experts * out, bytes per row): expert e is rows [e out, (e + 1) out)
        nbytes = out * raw.shape[1]
        for e in range(num_experts):
            release = functools.partial(gf.release, info.offset + e * nbytes, nbytes)
            yield template.format(e=e), GGUFQuantized(raw[e * out : (e + 1) * out], info.ggml_type, info.shape[1:],
                                                      release)
        return
    w = gf.load(info.name)
    for e in range(num_experts):
        yield template.format(e=e), torch.from_numpy(np.ascontiguousarray(w[e]))


def nothing() -> None:
    """A release() for data that holds no file pages (a copy)."""


def _hf_name(name: str, cfg: ModelConfig, permuted: bool) -> tuple[str, int]:
    """llama.cpp's tensor name -> (HF name, the head count to un-permute its rows by, or 0)."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight", 0
    if name == "output_norm.weight":
        return "model.norm.weight", 0
    if name == "token_embd_norm.weight" and cfg.architecture in ("lfm2", "lfm2_moe"):  # LFM2's final norm (HF's embedding_norm)
        return "model.embedding_norm.weight", 0
    if name == "output.weight":
        return "lm_head.weight", 0
    if name in _GGUF_EXTRAS:
        return _GGUF_EXTRAS[name], 0
    if re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight", name):
        raise ValueError(f"GGUF tensor {name}: one tensor per expert is llama.cpp's old Mixtral layout, not "
                         "supported; a file converted by a current llama.cpp stacks them (ffn_gate_exps)")
    # (Qwen3.5's ssm_a has no suffix; LFM2's shortconv.conv has a dot)
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+(?:\.(?!weight$|bias$)\w+)?)(\.weight|\.bias|)", name):
        layer, part, kind = m.groups()
        moe = _GGUF_TO_HF_MOE.get(cfg.architecture, {})
        if part in moe:
            return f"model.layers.{layer}.{moe[part]}{kind}", 0
        table = _GGUF_TO_HF | _GGUF_TO_HF_BY_ARCH.get(cfg.architecture, {})
        if part not in table:
            raise ValueError(f"unexpected GGUF tensor {name}")
        n_head = 0
        if permuted and part == "attn_q":
            n_head = cfg.num_heads
        elif permuted and part == "attn_k":
            n_head = cfg.num_kv_heads
        return f"model.layers.{layer}.{table[part]}{kind}", n_head
    raise ValueError(f"unexpected GGUF tensor {name}")


def safetensors_weights(path: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    for file in tqdm(files, desc="Loading weights", unit="file", disable=not progress, leave=False):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def read_weights(source: ModelSource, cfg: ModelConfig, progress: bool = True,
                 keep_quantized: KeepQuantized | None = None) -> Iterator[tuple[str, torch.Tensor | GGUFQuantized]]:
    """The (name, tensor) pairs of a model source, whichever format it is in; GGUF tensors that
    `keep_quantized` picks come as their blocks (GGUFQuantized)."""
    if source.kind == "gguf":
        yield from gguf_weights(GGUFFile(source.path), cfg, progress, keep_quantized)
    elif cfg.architecture in INTERLEAVED_ROTARY:
        for name, w in safetensors_weights(source.path, progress):
            yield name, interleaved_qk_rows(name, w, cfg)
    else:
        yield from safetensors_weights(source.path, progress)


def interleaved_qk_rows(name: str, w: torch.Tensor, cfg: ModelConfig, to_halves: bool = True) -> torch.Tensor:
    """An INTERLEAVED_ROTARY family's q / k projection (weight or bias) with each head's rows reordered from
    adjacent pairs into halves (at load), or back (`to_halves=False`, for convert); other tensors as they are."""
    heads = (cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads if ".k_proj." in name else 0)
    if not heads:
        return w
    return _to_halves(w, heads, cfg, back=not to_halves).contiguous()
