"""ModelConfig: the architecture numbers of a model, read from a GGUF header or an HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
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
        return cls(
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
        return cls(
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
