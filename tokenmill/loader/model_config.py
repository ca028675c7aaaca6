"""ModelConfig: the architecture numbers of a model, read from a GGUF header or an HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenmill.loader import architectures


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # a name in loader/architectures.py
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: dict[str, Any] | None = None
    name: str = ""
    quantization: str = "none"  # how the weights are stored on disk, e.g. "GGUF Q4_1"
    # phi3 (models/phi3.py) sets these; each means the same for any family that reads it
    rotary_dim: int | None = None  # leading dims of each head that rotate (partial rotary); None: head_dim
    sliding_window: int | None = None  # a query sees this many keys, itself included; None: all before it

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_parameters(self) -> int:
        d, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * i + 2 * d
        bias = (q + 2 * kv) * self.num_layers if self.attention_bias else 0
        return self.num_layers * per_layer + bias + v * d * (1 if self.tie_word_embeddings else 2) + d

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of every matmul weight: per layer qkv, o, gate_up, down, and the
        output layer when it is not tied to the embedding."""
        d, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = [(q + 2 * kv, d), (d, q), (2 * i, d), (d, i)]
        head = [] if self.tie_word_embeddings else [(self.vocab_size, d)]
        return per_layer * self.num_layers + head

    # -- readers ---------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], tensor_names: set[str], quantization: str) -> ModelConfig:
        arch = str(metadata.get("general.architecture", ""))  # the prefix of its metadata keys
        ours = architectures.from_gguf_name(arch)

        def get(key: str, default: Any = None) -> Any:
            v = metadata.get(f"{arch}.{key}", default)
            if v is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}")
            return v

        n_heads = int(get("attention.head_count"))
        n_kv = get("attention.head_count_kv", n_heads)
        hidden = int(get("embedding_length"))
        head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // n_heads))
        vocab = metadata.get(f"{arch}.vocab_size")
        if vocab is None:
            vocab = len(metadata.get("tokenizer.ggml.tokens", []))
        rope_scaling = None
        stype = metadata.get(f"{arch}.rope.scaling.type")
        if stype and stype != "none":
            rope_scaling = {"rope_type": str(stype), "factor": float(metadata.get(f"{arch}.rope.scaling.factor", 1.0)),
                            "original_max_position_embeddings":
                                int(metadata.get(f"{arch}.rope.scaling.original_context_length", 0))}
        if "rope_freqs.weight" in tensor_names:
            rope_scaling = {"rope_type": "gguf_rope_freqs"}  # per-frequency factors stored as a tensor
        cfg = cls(
            architecture=ours.name,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=n_heads,
            num_kv_heads=int(n_kv if not hasattr(n_kv, "__len__") else n_kv[0]),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            rope_scaling=rope_scaling,
            name=str(metadata.get("general.name", "")),
            quantization=quantization,
        )
        if ours.name == "phi3":
            cfg = _phi3_from_gguf(cfg, metadata, arch, tensor_names)
        return cfg

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        cfg = json.loads((Path(path) / "config.json").read_text())
        archs = cfg.get("architectures") or []
        try:
            arch = architectures.from_hf_config(list(archs), cfg.get("model_type")).name
        except ValueError as e:
            raise ValueError(f"{path}/config.json: {e}") from None
        n_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        out = cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=n_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or hidden // n_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            # transformers < 5 writes rope_scaling; 5.x folds it (and rope_theta) into rope_parameters
            rope_scaling=cfg.get("rope_scaling") or cfg.get("rope_parameters"),
            name=str(cfg.get("_name_or_path", Path(path).name)),
            quantization=str(cfg.get("torch_dtype", cfg.get("dtype", "safetensors"))),
        )
        if arch == "phi3":
            out = _phi3_from_hf(out, cfg, Path(path))
        return out


# -- phi3 ------------------------------------------------------------------------------------------------
# Phi-3 / Phi-3.5 / Phi-4-mini: LongRoPE (short and long per-frequency factors, an attention factor on cos and
# sin), partial rotary (Phi-4-mini rotates 0.75 of each head) and a sliding window in the config. The rope
# scaling is normalised to {"rope_type": "longrope", "short_factor", "long_factor",
# "original_max_position_embeddings", "attention_factor"?} (layers/rotary.py reads it); from a GGUF the
# two factor lists are tensors, which the model folds in (models/phi3.py).

def _phi3_from_hf(cfg: ModelConfig, raw: dict[str, Any], path: Path) -> ModelConfig:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}/config.json: phi3 with hidden_act {act!r} is not supported (supported: silu)")
    rs = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    kind = rs.get("rope_type") or rs.get("type") or "default"
    partial = float(rs.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(cfg.head_dim * partial)  # as transformers rounds it
    scaling: dict[str, Any] | None = None
    if kind == "su":  # the type's first name; transformers reads it as longrope
        kind = "longrope"
    if kind == "longrope":
        unknown = set(rs) - {"rope_type", "type", "short_factor", "long_factor", "original_max_position_embeddings",
                             "attention_factor", "factor", "rope_theta", "partial_rotary_factor"}
        if unknown:  # e.g. short_mscale / long_mscale, which transformers ignores and vLLM applies
            raise ValueError(f"{path}/config.json: longrope with {sorted(unknown)} is not supported")
        original = rs.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
        if not original or "short_factor" not in rs or "long_factor" not in rs:
            raise ValueError(f"{path}/config.json: longrope needs short_factor, long_factor and "
                             "original_max_position_embeddings")
        scaling = {"rope_type": "longrope", "short_factor": [float(f) for f in rs["short_factor"]],
                   "long_factor": [float(f) for f in rs["long_factor"]],
                   "original_max_position_embeddings": int(original),
                   "attention_factor": rs.get("attention_factor"), "factor": rs.get("factor")}
    elif kind != "default":  # the model's rotary would refuse it too; say so with the file's name
        raise ValueError(f"{path}/config.json: phi3 with rope scaling {kind!r} is not supported "
                         "(supported: default, longrope)")
    window = raw.get("sliding_window")
    return replace(cfg, rope_scaling=scaling, rotary_dim=rotary_dim if rotary_dim != cfg.head_dim else None,
                   sliding_window=int(window) if window else None)


def _phi3_from_gguf(cfg: ModelConfig, md: dict[str, Any], arch: str, tensor_names: set[str]) -> ModelConfig:
    """llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) writes rope.dimension_count (partial rotary),
    attention.sliding_window (0: none), and for longrope the factor tensors rope_factors_long / _short with
    rope.scaling.original_context_length and rope.scaling.attn_factor."""
    rotary_dim = int(md.get(f"{arch}.rope.dimension_count", cfg.head_dim))
    window = int(md.get(f"{arch}.attention.sliding_window", 0))
    scaling = cfg.rope_scaling
    if {"rope_factors_long.weight", "rope_factors_short.weight"} & tensor_names:
        if scaling is not None:  # e.g. rope.scaling.type yarn beside the factor tensors
            raise ValueError(f"GGUF phi3 with rope scaling {scaling.get('rope_type')!r} and longrope factor "
                             "tensors is not supported")
        original = md.get(f"{arch}.rope.scaling.original_context_length", cfg.max_position_embeddings)
        # absent: transformers' rule from the context lengths (rotary.attention_factor); llama.cpp would take
        # 1.0, but its converter always writes the key beside the factor tensors
        factor = md.get(f"{arch}.rope.scaling.attn_factor")
        scaling = {"rope_type": "longrope", "original_max_position_embeddings": int(original),
                   "attention_factor": None if factor is None else float(factor)}
    return replace(cfg, rope_scaling=scaling, rotary_dim=rotary_dim if rotary_dim != cfg.head_dim else None,
                   sliding_window=window or None)
