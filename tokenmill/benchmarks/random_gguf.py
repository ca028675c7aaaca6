"""Write a random-weight GGUF of a given shape and quantization mix, quantized by ggml's own quantizer.

For tests (tiny models in each quant type) and for the 7B-class memory and speed check, without
downloading anything: the tokenizer is the default model's (padded with unused tokens to the vocabulary
size asked for), the weights are N(0, std) and quantized row by row as they are written, so even a
7B-class file never needs its fp32 copy in memory.

    python -m tokenmill.benchmarks.random_gguf out.gguf --preset qwen2.5-7b --mix q4_k_m
    python -m tokenmill.benchmarks.random_gguf moe.gguf --preset qwen3-30b-a3b-4l --mix q4_k_m
    python -m tokenmill.benchmarks.random_gguf oss.gguf --preset gpt-oss-20b --mix mxfp4_moe
    python -m tokenmill.benchmarks.random_gguf g.gguf --preset granite-4.0-h-tiny --mix q4_k_m
    python -m tokenmill.benchmarks.random_gguf l.gguf --preset lfm2-8b-a1b --mix q4_k_m

Mixes follow llama.cpp's recipes in spirit: `q4_k_m` / `q5_k_m` keep attn_v and ffn_down of about half
the layers (the first and last eighth, and every third in between) and the output layer in Q6_K; a plain
type name ("q4_0", "q8_0", "q6_k", ...) uses that type for every matrix; `mxfp4_moe` (gpt-oss's own files)
puts the experts in MXFP4 and every other matrix in Q8_0. Norms, biases and sinks are F32, and so are the
router, the recurrent layers' convolutions and Mamba2's A, D and norm (as llama-quantize leaves them).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_POOL_VALUES = 1 << 24  # matrices above this many values reuse a pool of 16M quantized values per (type, row)

@dataclass(frozen=True)
class Shape:
    arch: str = "llama"
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 49152
    tied: bool = False
    context: int = 4096
    attention_bias: bool = False
    head_dim: int = 0  # 0: hidden // heads
    qk_norm: bool = False  # Qwen3's attn_q_norm / attn_k_norm
    # a mixture of experts (arch qwen3moe, or llama for Mixtral): `experts` of `expert_intermediate` each
    # layer, `experts_used` per token, instead of the dense MLP
    experts: int = 0
    experts_used: int = 0
    expert_intermediate: int = 0
    # arch gpt-oss: attention biases and sinks, biased router and experts, `window` keys on the even layers,
    # YaRN (factor 32 over 4096 positions), post_attention_norm before the MLP
    window: int = 0
    # arch qwen35: Gated DeltaNet layers (three in every four; `linear_heads` key and value heads of
    # `linear_dim`), gated attention with q / k norms and a quarter of each head rotated on the others
    linear_heads: tuple[int, int] = (0, 0)
    linear_dim: int = 0
    # arch granitehybrid (Granite 4.0-H, as conversion/granite.py writes it) and lfm2moe (LFM2-MoE, conversion/
    # lfm2.py): GQA attention at `attn_layers`, the others Mamba2 (granitehybrid: `ssm_heads` of `ssm_head_dim`,
    # d_state `ssm_state`, `ssm_groups` groups of B / C, `conv_kernel` taps; NoPE) or LFM2's gated short conv
    # (`conv_kernel`: L_cache); head_count_kv per layer, 0 on the recurrent ones. granitehybrid: a shared MLP of
    # `shared_intermediate` beside the experts (`intermediate` is the experts' width there, as the converter
    # writes feed_forward_length); lfm2moe: the first `dense_layers` layers a dense MLP of `intermediate`, then
    # experts chosen by sigmoid scores plus a bias (exp_probs_b), q / k norms, the final norm as token_embd_norm.
    attn_layers: tuple[int, ...] = ()
    shared_intermediate: int = 0
    ssm_heads: int = 0
    ssm_head_dim: int = 0
    ssm_state: int = 0
    ssm_groups: int = 1
    conv_kernel: int = 4
    dense_layers: int = 0


PRESETS = {
    "qwen2.5-7b": Shape("qwen2", 3584, 18944, 28, 28, 4, 152064, attention_bias=True),
    "tiny-256": Shape("llama", 256, 512, 2, 4, 2, 49152),
    # Qwen3.5-0.8B's and -4B's shapes (head_dim 256; 16 key / 16 or 32 value heads of 128 in the linear layers)
    "qwen3.5-0.8b": Shape("qwen35", 1024, 3584, 24, 8, 2, 248320, tied=True, head_dim=256, qk_norm=True,
                          linear_heads=(16, 16), linear_dim=128),
    "qwen3.5-4b": Shape("qwen35", 2560, 9216, 32, 16, 4, 248320, tied=True, head_dim=256, qk_norm=True,
                        linear_heads=(16, 32), linear_dim=128),
    # Qwen3-4B's shapes (36 layers, 32 heads of 128, 8 KV heads, q / k norms, tied)
    # Qwen2.5-0.5B's shapes: 896 wide, so a Q4_K_M file is mostly llama-quantize's Q5_0 / Q8_0 stand-ins
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, tied=True, context=32768, attention_bias=True),
    "qwen3-4b": Shape("qwen3", 2560, 9728, 36, 32, 8, 151936, tied=True, head_dim=128, qk_norm=True),
    # Qwen3-30B-A3B's layer shape (128 experts of 768, 8 used, head_dim 128), 16 of its 48 layers
    "qwen3-30b-a3b-16l": Shape("qwen3moe", 2048, 6144, 16, 32, 4, 151936, head_dim=128, qk_norm=True, experts=128,
                               experts_used=8, expert_intermediate=768),
    # Qwen3-30B-A3B's layer shape (128 experts of 768, 8 used, head_dim 128), 4 of its 48 layers
    "qwen3-30b-a3b-4l": Shape("qwen3moe", 2048, 6144, 4, 32, 4, 151936, head_dim=128, qk_norm=True, experts=128,
                              experts_used=8, expert_intermediate=768),
    # gpt-oss-20b's shapes (24 layers, 32 experts of 2880, 4 used, 64 heads of 64, 8 KV heads, window 128)
    "gpt-oss-20b": Shape("gpt-oss", 2880, 2880, 24, 64, 8, 201088, context=131072, attention_bias=True, head_dim=64,
                         experts=32, experts_used=4, expert_intermediate=2880, window=128),
    # Granite 4.0-H-Tiny's shapes: 40 layers, attention (12 heads of 128, 4 KV heads, NoPE) at 5, 15, 25, 35 and
    # Mamba2 elsewhere (48 heads of 64, d_state 128, 1 group), 62 experts of 512 (6 used) beside a shared MLP of 1024
    "granite-4.0-h-tiny": Shape("granitehybrid", 1536, 512, 40, 12, 4, 100352, tied=True, context=2**20,
                                head_dim=128, experts=62, experts_used=6, expert_intermediate=512,
                                attn_layers=(5, 15, 25, 35), shared_intermediate=1024, ssm_heads=48,
                                ssm_head_dim=64, ssm_state=128, ssm_groups=1, conv_kernel=4),
    # LFM2-8B-A1B's shapes: 24 layers, attention (32 heads of 64, 8 KV heads) at 2, 6, 10, 14, 18, 21 and short
    # convs (L_cache 3) elsewhere; 2 dense layers of 7168, then 32 experts of 1792 (4 used)
    "lfm2-8b-a1b": Shape("lfm2moe", 2048, 7168, 24, 32, 8, 65536, tied=True, context=128000, head_dim=64,
                         qk_norm=True, experts=32, experts_used=4, expert_intermediate=1792,
                         attn_layers=(2, 6, 10, 14, 18, 21), conv_kernel=3, dense_layers=2),
}


# llama-quantize's types for a K-quant whose rows are not a multiple of 256 values
_K_FALLBACK = {"q2_k": "iq4_nl", "q3_k": "iq4_nl", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def _more_bits(layer: int, n: int) -> bool:
    return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layers: int, mix: str) -> str:
    """The ggml type name of tensor `name` (llama.cpp naming) in `mix`."""
    if mix == "mxfp4_moe":  # llama-quantize's MXFP4_MOE (gpt-oss's own GGUFs): experts MXFP4, the rest Q8_0
        return "mxfp4" if name.endswith("_exps.weight") else "q8_0"
    if mix in ("q4_k_m", "q5_k_m"):
        base = mix[:4]
        if name == "output.weight":
            return "q6_k"
        if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")) \
                and _more_bits(layer, n_layers):
            return "q6_k"
        return base
    return mix


def add_default_tokenizer(w: Any, vocab: int) -> None:
    """Write the default model's tokenizer into the gguf.GGUFWriter `w` with `vocab` entries: padded with
    unused tokens when larger; when smaller, its first `vocab` tokens and the merges that make them (a
    byte-level BPE's token ids follow its merge order, so this is the same tokenizer stopped early; every
    text still encodes, in more tokens). A small vocabulary keeps a tiny model's logits and sampling cheap."""
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path

    src = GGUFFile(default_model_path()).metadata
    tokens = list(src["tokenizer.ggml.tokens"])
    types = [int(t) for t in src["tokenizer.ggml.token_type"]]
    merges = list(src["tokenizer.ggml.merges"])
    if vocab < len(tokens):
        from tokenizers.pre_tokenizers import ByteLevel

        kept, full = set(tokens[:vocab]), set(tokens)
        missing = [c for c in ByteLevel.alphabet() if c in full and c not in kept]  # the 256 byte symbols
        if missing:
            raise ValueError(f"vocab {vocab} drops byte tokens of the default tokenizer ({len(missing)} missing)")
        tokens, types = tokens[:vocab], types[:vocab]
        merges = [m for m in merges if m.replace(" ", "") in kept and all(p in kept for p in m.split(" "))]
    tokens += [f"<unused_{i}>" for i in range(vocab - len(tokens))]
    types += [5] * (vocab - len(types))  # 5: unused
    w.add_tokenizer_model(str(src["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(src["tokenizer.ggml.pre"]))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(src["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(src["tokenizer.ggml.eos_token_id"]))
    w.add_add_bos_token(False)
    w.add_chat_template(str(src["tokenizer.chat_template"]))


def _hybrid_layer(s: Shape, i: int, hd: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Layer i's tensors of a granitehybrid or lfm2moe Shape, llama.cpp's names and shapes (rows, k)."""
    p = f"blk.{i}."
    t: list[tuple[str, tuple[int, ...], str]] = [(p + "attn_norm.weight", (s.hidden,), "f32"),
                                                  (p + "ffn_norm.weight", (s.hidden,), "f32")]
    if i in s.attn_layers:
        t += [(p + "attn_q.weight", (s.heads * hd, s.hidden), ""), (p + "attn_k.weight", (s.kv_heads * hd, s.hidden), ""),
              (p + "attn_v.weight", (s.kv_heads * hd, s.hidden), ""),
              (p + "attn_output.weight", (s.hidden, s.heads * hd), "")]
        if s.qk_norm:
            t += [(p + "attn_q_norm.weight", (hd,), "f32"), (p + "attn_k_norm.weight", (hd,), "f32")]
    elif s.arch == "granitehybrid":  # Mamba2: in_proj -> z (I), x | B | C (the conv's channels), dt (H)
        h, inner, g = s.ssm_heads, s.ssm_heads * s.ssm_head_dim, s.ssm_groups
        conv = inner + 2 * g * s.ssm_state
        t += [(p + "ssm_in.weight", (inner + conv + h, s.hidden), ""),
              (p + "ssm_conv1d.weight", (conv, s.conv_kernel), "f32"), (p + "ssm_conv1d.bias", (conv,), "f32"),
              (p + "ssm_dt.bias", (h,), "f32"), (p + "ssm_a", (h, 1), "f32"), (p + "ssm_d", (h, 1), "f32"),
              (p + "ssm_norm.weight", (g, inner // g), "f32"), (p + "ssm_out.weight", (s.hidden, inner), "")]
    else:  # LFM2's gated short conv: in_proj -> B | C | x, a depthwise conv of L_cache taps, out_proj
        t += [(p + "shortconv.conv.weight", (s.hidden, s.conv_kernel), "f32"),
              (p + "shortconv.in_proj.weight", (3 * s.hidden, s.hidden), ""),
              (p + "shortconv.out_proj.weight", (s.hidden, s.hidden), "")]
    if i < s.dense_layers or not s.experts:
        f = s.intermediate if s.arch == "lfm2moe" or not s.shared_intermediate else s.shared_intermediate
        return t + [(p + "ffn_gate.weight", (f, s.hidden), ""), (p + "ffn_up.weight", (f, s.hidden), ""),
                    (p + "ffn_down.weight", (s.hidden, f), "")]
    e, f = s.experts, s.expert_intermediate
    t += [(p + "ffn_gate_inp.weight", (e, s.hidden), "f32"), (p + "ffn_gate_exps.weight", (e, f, s.hidden), ""),
          (p + "ffn_up_exps.weight", (e, f, s.hidden), ""), (p + "ffn_down_exps.weight", (e, s.hidden, f), "")]
    if s.arch == "lfm2moe":
        t.append((p + "exp_probs_b.bias", (e,), "f32"))
    if s.shared_intermediate:
        si = s.shared_intermediate
        t += [(p + "ffn_gate_shexp.weight", (si, s.hidden), ""), (p + "ffn_up_shexp.weight", (si, s.hidden), ""),
              (p + "ffn_down_shexp.weight", (s.hidden, si), "")]
    return t


def write_random_gguf(path: str | Path, shape: Shape, mix: str, std: float = 0.05, seed: int = 0,
                      name: str = "random", extra_metadata: dict[str, float | int | str] | None = None) -> Path:
    """A random-weight GGUF of `shape` with the default model's tokenizer; `extra_metadata`: more keys
    (float, int or str values), e.g. general.sampling.temp."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    from tokenmill.native import ggml

    path = Path(path)
    s = shape
    hd = s.head_dim or s.hidden // s.heads
    rng = np.random.default_rng(seed)
    tensors: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (s.vocab, s.hidden), "")]
    q35 = s.arch == "qwen35"
    hk, hv = s.linear_heads
    conv_dim, value_dim = (2 * hk + hv) * s.linear_dim, hv * s.linear_dim
    for i in range(s.layers):
        p = f"blk.{i}."
        if s.arch in ("granitehybrid", "lfm2moe"):
            tensors += _hybrid_layer(s, i, hd)
            continue
        if q35 and (i + 1) % 4:  # a Gated DeltaNet layer (llama.cpp's qwen35 tensors)
            tensors += [(p + "attn_norm.weight", (s.hidden,), "f32"),
                        (p + "attn_qkv.weight", (conv_dim, s.hidden), ""),
                        (p + "attn_gate.weight", (value_dim, s.hidden), ""),
                        (p + "ssm_alpha.weight", (hv, s.hidden), "f32"), (p + "ssm_beta.weight", (hv, s.hidden), "f32"),
                        (p + "ssm_a", (hv,), "f32"), (p + "ssm_dt.bias", (hv,), "f32"),
                        (p + "ssm_conv1d.weight", (conv_dim, 4), "f32"), (p + "ssm_norm.weight", (s.linear_dim,), "f32"),
                        (p + "ssm_out.weight", (s.hidden, value_dim), ""),
                        (p + "post_attention_norm.weight", (s.hidden,), "f32"),
                        (p + "ffn_gate.weight", (s.intermediate, s.hidden), ""),
                        (p + "ffn_up.weight", (s.intermediate, s.hidden), ""),
                        (p + "ffn_down.weight", (s.hidden, s.intermediate), "")]
            continue
        tensors += [(p + "attn_norm.weight", (s.hidden,), "f32"),
                    (p + "attn_q.weight", ((2 if q35 else 1) * s.heads * hd, s.hidden), ""),  # qwen35: q and its gate
                    (p + "attn_k.weight", (s.kv_heads * hd, s.hidden), ""),
                    (p + "attn_v.weight", (s.kv_heads * hd, s.hidden), "")]
        if s.attention_bias:
            tensors += [(p + "attn_q.bias", (s.heads * hd,), "f32"), (p + "attn_k.bias", (s.kv_heads * hd,), "f32"),
                        (p + "attn_v.bias", (s.kv_heads * hd,), "f32")]
        if s.qk_norm:
            tensors += [(p + "attn_q_norm.weight", (hd,), "f32"), (p + "attn_k_norm.weight", (hd,), "f32")]
        oss = s.arch == "gpt-oss"
        tensors += [(p + "attn_output.weight", (s.hidden, s.heads * hd), ""),
                    (p + ("post_attention_norm" if oss or q35 else "ffn_norm") + ".weight", (s.hidden,), "f32")]
        if oss:
            tensors += [(p + "attn_output.bias", (s.hidden,), "f32"), (p + "attn_sinks.weight", (s.heads,), "f32")]
        if s.experts:  # the router stays F32, as llama.cpp's quantizer leaves it; experts stacked in 3-D
            e, f = s.experts, s.expert_intermediate
            tensors += [(p + "ffn_gate_inp.weight", (e, s.hidden), "f32"),
                        (p + "ffn_gate_exps.weight", (e, f, s.hidden), ""),
                        (p + "ffn_up_exps.weight", (e, f, s.hidden), ""),
                        (p + "ffn_down_exps.weight", (e, s.hidden, f), "")]
            if oss:
                tensors += [(p + "ffn_gate_inp.bias", (e,), "f32"), (p + "ffn_gate_exps.bias", (e, f), "f32"),
                            (p + "ffn_up_exps.bias", (e, f), "f32"), (p + "ffn_down_exps.bias", (e, s.hidden), "f32")]
        else:
            tensors += [(p + "ffn_gate.weight", (s.intermediate, s.hidden), ""),
                        (p + "ffn_up.weight", (s.intermediate, s.hidden), ""),
                        (p + "ffn_down.weight", (s.hidden, s.intermediate), "")]
    tensors.append(("token_embd_norm.weight" if s.arch == "lfm2moe" else "output_norm.weight", (s.hidden,), "f32"))
    if not s.tied:
        tensors.append(("output.weight", (s.vocab, s.hidden), ""))

    def type_of(tname: str, tshape: tuple[int, ...], t: str) -> str:
        layer = int(tname.split(".")[1]) if tname.startswith("blk.") else 0
        # (a tied embedding is the output layer, and llama-quantize types it so)
        chosen = t or tensor_type("output.weight" if s.tied and tname == "token_embd.weight" else tname, layer,
                                  s.layers, mix)
        # a K-quant needs rows of whole 256-value super-blocks: llama-quantize's stand-ins otherwise (Qwen2.5-0.5B's
        # and Gemma 3 270M's 896 / 640-wide matrices in a Q4_K_M file: Q5_0 for Q4_K, Q8_0 for Q6_K)
        return _K_FALLBACK.get(chosen, chosen) if len(tshape) > 1 and tshape[-1] % 256 else chosen

    w = GGUFWriter(path, s.arch)
    a = s.arch
    w.add_name(name)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.feed_forward_length", s.intermediate)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    if s.attn_layers:  # per layer, 0 on the recurrent ones (as llama.cpp's converter writes hybrids)
        w.add_array(f"{a}.attention.head_count_kv", [s.kv_heads if i in s.attn_layers else 0 for i in range(s.layers)])
    else:
        w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_float32(f"{a}.rope.freq_base", 150000.0 if a == "gpt-oss" else 10000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.vocab_size", s.vocab)
    w.add_uint32(f"{a}.rope.dimension_count", hd // 4 if q35 else hd)
    w.add_uint32(f"{a}.attention.key_length", hd)
    w.add_uint32(f"{a}.attention.value_length", hd)
    if s.experts:
        w.add_uint32(f"{a}.expert_count", s.experts)
        w.add_uint32(f"{a}.expert_used_count", s.experts_used)
        if a != "granitehybrid":  # there feed_forward_length is the experts' width
            w.add_uint32(f"{a}.expert_feed_forward_length", s.expert_intermediate)
    if s.window:
        w.add_uint32(f"{a}.attention.sliding_window", s.window)
    if q35:
        for key, n in (("conv_kernel", 4), ("state_size", s.linear_dim), ("group_count", hk),
                       ("time_step_rank", hv), ("inner_size", value_dim)):
            w.add_uint32(f"{a}.ssm.{key}", n)
        w.add_uint32(f"{a}.full_attention_interval", 4)
        w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
    if a == "gpt-oss":  # as llama.cpp's converter writes gpt-oss's YaRN
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
        w.add_float32(f"{a}.rope.scaling.yarn_beta_fast", 32.0)
        w.add_float32(f"{a}.rope.scaling.yarn_beta_slow", 1.0)
    if a == "granitehybrid":  # Granite 4.0-H-Tiny's multipliers; Mamba2's shape; NoPE (rope.scaling.finetuned false)
        w.add_float32(f"{a}.attention.scale", 0.0078125)
        w.add_float32(f"{a}.embedding_scale", 12.0)
        w.add_float32(f"{a}.residual_scale", 0.22)
        w.add_float32(f"{a}.logit_scale", 6.0)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", s.shared_intermediate)
        for key, n in (("conv_kernel", s.conv_kernel), ("state_size", s.ssm_state), ("group_count", s.ssm_groups),
                       ("inner_size", s.ssm_heads * s.ssm_head_dim), ("time_step_rank", s.ssm_heads)):
            w.add_uint32(f"{a}.ssm.{key}", n)
        w.add_bool(f"{a}.rope.scaling.finetuned", False)
    if a == "lfm2moe":
        w.add_uint32(f"{a}.leading_dense_block_count", s.dense_layers)
        w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        w.add_uint32(f"{a}.shortconv.l_cache", s.conv_kernel)
    add_default_tokenizer(w, s.vocab)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_int32(key, value)
        else:
            w.add_float32(key, value)
    for tname, tshape, t in tensors:
        qtype = GGMLQuantizationType[type_of(tname, tshape, t).upper()]
        block, size = GGML_QUANT_SIZES[qtype]
        if len(tshape) == 1:
            w.add_tensor_info(tname, tshape, np.dtype(np.float32), tshape[0] * 4)
        else:  # (rows, k) or (experts, rows, k): the rows of every expert, one after another
            *lead, k = tshape
            rows = int(np.prod(lead))
            w.add_tensor_info(tname, (*lead, k // block * size), np.dtype(np.uint8), rows * (k // block * size),
                              raw_dtype=qtype)
    pools: dict[tuple[object, int], np.ndarray] = {}
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    def small(tname: str, n: int) -> np.ndarray:  # a norm, bias or per-head value
        arr = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32) if "norm" in tname else \
            (0.1 * rng.standard_normal(n)).astype(np.float32)
        if tname.endswith(".ssm_a"):  # -exp(A_log): a decay, negative
            arr = -np.exp(arr)
        return arr

    for tname, tshape, t in tensors:
        if len(tshape) == 1:
            w.write_tensor_data(small(tname, tshape[0]))
            continue
        if tname.endswith((".ssm_a", ".ssm_d", ".ssm_norm.weight")):  # Mamba2's (H, 1) and (groups, d_inner / groups)
            w.write_tensor_data(small(tname, int(np.prod(tshape))).reshape(tshape))
            continue
        qtype = GGMLQuantizationType[type_of(tname, tshape, t).upper()]
        *lead, k = tshape
        rows = int(np.prod(lead))
        block, size = GGML_QUANT_SIZES[qtype]
        out = np.empty((rows, k // block * size), dtype=np.uint8)
        pool_rows = max(1, _POOL_VALUES // k)
        if qtype == GGMLQuantizationType.F32:  # e.g. a router: the values themselves
            out[:] = (std * rng.standard_normal((rows, k), dtype=np.float32)).view(np.uint8)
        elif rows <= pool_rows:
            x = std * rng.standard_normal((rows, k), dtype=np.float32)
            ggml.quantize(int(qtype), x.ctypes.data, out.ctypes.data, rows, k)
        else:  # a big matrix: rows drawn from a pool of quantized random rows (ggml's K-quant search is slow)
            pool = pools.get((qtype, k))
            if pool is None:
                x = std * rng.standard_normal((pool_rows, k), dtype=np.float32)
                pool = np.empty((pool_rows, out.shape[1]), dtype=np.uint8)
                ggml.quantize(int(qtype), x.ctypes.data, pool.ctypes.data, pool_rows, k)
                pools[(qtype, k)] = pool
            out[:] = pool[rng.integers(0, pool_rows, rows)]
        w.write_tensor_data(out.reshape(*lead, -1))
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenmill.benchmarks.random_gguf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny-256")
    p.add_argument("--mix", default="q4_k_m", help="q4_k_m, q5_k_m, or one ggml type (q4_0, q8_0, q6_k, ...)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = write_random_gguf(args.out, PRESETS[args.preset], args.mix, seed=args.seed,
                            name=f"random {args.preset} {args.mix}")
    print(f"wrote {out} ({out.stat().st_size / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
