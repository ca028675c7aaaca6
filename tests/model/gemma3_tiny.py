"""Tiny random Gemma 3 (and Gemma 2) checkpoints for the tests: an HF directory written by transformers' own
Gemma3ForCausalLM (Gemma2ForCausalLM), and a GGUF of the same weights written with the `gguf` package under
llama.cpp's tensor names and metadata keys (norms stored as 1 + w, as llama.cpp's converter stores them).

The vocabulary is the default model's (its tokenizer makes the directory and the GGUF complete)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from raw_forward import add_hparams

WINDOW = 16  # shorter than the test prompts, so the local layers' window matters

# HF module name (after model.layers.N.) -> llama.cpp tensor name (after blk.N.)
_HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def default_tokenizer() -> Any:
    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    gf = GGUFFile(default_model_path())
    try:
        return Tokenizer.from_gguf(dict(gf.metadata)), dict(gf.metadata)
    finally:
        gf.close()


def make_hf_model(transformers: Any, vocab: int, **overrides: Any) -> Any:
    """A random Gemma3ForCausalLM: 6 layers in Gemma's pattern (5 local, then 1 global: what llama.cpp
    assumes, so the GGUF agrees), GQA, head dim 32, a window of 16, linear rope scaling on the global
    layer, logit soft-capping, norms far from their defaults. query_pre_attn_scalar == head_dim, as
    llama.cpp assumes (a GGUF has no key for it)."""
    kw: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
        sliding_window=WINDOW,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        query_pre_attn_scalar=32, final_logit_softcapping=30.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=True)
    kw.update(overrides)
    return _random(transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(**kw))


def _random(cls: Any, cfg: Any, qk_std: float = 0.08) -> Any:
    """cls(cfg) with seeded random weights: matrices N(0, 0.08) (q and k: qk_std; embeddings 0.5), and the
    (1 + w) norms' w around 0, far enough from it that forgetting the 1 shows."""
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5)
            else:
                p.normal_(0, 0.5 if "embed" in name else qk_std if "q_proj" in name or "k_proj" in name else 0.08)
    return model


def make_hf_gemma2(transformers: Any, vocab: int, **overrides: Any) -> Any:
    """A random Gemma2ForCausalLM: 4 layers alternating local (first) and global, GQA, head dim 32, a window
    of 16, attention scores capped at 5 (so the cap bites: random weights' scores reach it) and logits at
    10, norms far from their defaults. query_pre_attn_scalar == head_dim, as llama.cpp assumes."""
    kw: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
        sliding_window=WINDOW, query_pre_attn_scalar=32, attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    kw.update(overrides)
    return _random(transformers.Gemma2ForCausalLM, transformers.Gemma2Config(**kw), qk_std=0.3)


def write_hf_dir(model: Any, tokenizer: Any, out: Path) -> Path:
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": tokenizer.chat_template}))
    return out


def write_gguf(model: Any, src_md: dict[str, Any], out: Path, matrix_type: str = "F32") -> Path:
    """The same weights as a GGUF: llama.cpp's names, its norm shift (+1), 2-D weights as `matrix_type`
    (F32 or Q8_0, quantized by gguf-py's numpy quantizer)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    cfg = model.config
    a = "gemma2" if cfg.model_type == "gemma2" else "gemma3"
    w = GGUFWriter(out, a)
    add_hparams(w, a, cfg, cfg.head_dim)
    full = cfg.rope_parameters["full_attention"] if a == "gemma3" else cfg.rope_parameters
    w.add_float32(f"{a}.rope.freq_base", full["rope_theta"])
    w.add_uint32(f"{a}.attention.sliding_window", cfg.sliding_window)
    if full.get("rope_type") == "linear":
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", float(full["factor"]))
    if cfg.final_logit_softcapping:
        w.add_float32(f"{a}.final_logit_softcapping", float(cfg.final_logit_softcapping))
    if a == "gemma2":  # llama.cpp's converter writes both caps
        w.add_float32(f"{a}.attn_logit_softcapping", float(cfg.attn_logit_softcapping))
    tokens = list(src_md["tokenizer.ggml.tokens"])
    w.add_tokenizer_model(str(src_md["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(src_md["tokenizer.ggml.pre"]))
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in src_md["tokenizer.ggml.token_type"]])
    w.add_token_merges(list(src_md["tokenizer.ggml.merges"]))
    w.add_bos_token_id(int(src_md["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(src_md["tokenizer.ggml.eos_token_id"]))
    w.add_add_bos_token(False)
    w.add_chat_template(str(src_md["tokenizer.chat_template"]))
    qtype = GGMLQuantizationType[matrix_type]
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        arr = t.detach().to(torch.float32).numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            parts = name.split(".")  # model.layers.N.<module...>.weight
            gname = f"blk.{parts[2]}.{_HF_TO_GGUF['.'.join(parts[3:-1])]}.weight"
        if gname.endswith("norm.weight"):
            arr = arr + np.float32(1.0)  # llama.cpp's Gemma3Model.norm_shift
        if arr.ndim == 2 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(gname, quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
