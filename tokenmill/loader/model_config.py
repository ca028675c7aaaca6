"""ModelConfig: the architecture numbers of a model, read from a GGUF header or an HF config.json."""

from __future__ import annotations

import json
import math
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
    hidden_act: str = "silu"  # the MLP's gate activation (HF hidden_act / hidden_activation)
    # phi3 (models/phi3.py) sets rotary_dim; each means the same for any family that reads it
    rotary_dim: int | None = None  # leading dims of each head that rotate (partial rotary); None: head_dim
    # sliding-window attention (Mistral, Phi-3: every layer; Gemma 3: its local layers)
    sliding_window: int | None = None  # W: a windowed layer's query at p sees W keys, (p - W, p]; None: all
    # per layer "sliding_attention" | "full_attention" (() and W: all windowed); Qwen3.5's "linear_attention" and
    # LFM2's "conv" layers keep a recurrent state instead of a KV cache
    layer_types: tuple[str, ...] = ()
    # Qwen3, Qwen3-MoE: RMSNorm over head_dim on each q and k head, before rotary
    qk_norm: bool = False
    # mixture of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): every layer's MLP is num_experts experts of
    # moe_intermediate_size, num_experts_per_tok of them chosen per token. 0 experts: a dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_renormalize: bool = False  # the chosen experts' softmax weights are rescaled to sum to 1
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: one always-on expert behind a sigmoid gate; 0: none
    # Ministral 3 (llama.cpp's attention.temperature_scale / _length): q *= 1 + scale ln(1 + floor(pos / length))
    attn_temperature_scale: float = 0.0  # 0: none
    attn_temperature_length: int = 0
    qk_norm_after_rotary: bool = False  # the per-head q / k norms after rotary instead of before (Hunyuan)
    shared_expert_gated: bool = True  # False: a shared expert's output is added as it is (GraniteMoeShared)
    # ERNIE 4.5 MoE: these layers have a dense MLP of intermediate_size instead of the experts (its first)
    dense_mlp_layers: tuple[int, ...] = ()
    # ERNIE 4.5 MoE: a per-expert bias added to the softmax probabilities to choose the experts, not to weigh them
    moe_selection_bias: bool = False
    # LFM2-MoE: experts scored by sigmoid(logit) (not softmax), the chosen weights times moe_routed_scaling
    moe_sigmoid: bool = False
    moe_routed_scaling: float = 1.0
    # Gemma 3
    rope_local_theta: float = 0.0  # rotary base of the local (windowed) layers; rope_theta is the global one
    query_pre_attn_scalar: float = 0.0  # attention scale = query_pre_attn_scalar ** -0.5; 0: head_dim ** -0.5
    final_logit_softcapping: float = 0.0  # logits = cap * tanh(logits / cap); 0: none
    attn_logit_softcapping: float = 0.0  # attention scores = cap * tanh(scores / cap) (Gemma 2); 0: none
    # Granite (HF's names): embeddings * embedding_multiplier; attention scale attention_multiplier (0: head_dim
    # ** -0.5); each sublayer's output * residual_multiplier before it joins the residual; logits / logits_scaling
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 0.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    # SmolLM3: the layers whose q and k are not rotated (NoPE); () : every layer rotates
    nope_layers: tuple[int, ...] = ()
    # gpt-oss's experts: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    # Qwen3.5's Gated DeltaNet layers ("linear_attention" in layer_types; models/qwen3_5.py): no KV cache, a
    # recurrent state per sequence instead (a conv window and a (value heads, dk, dv) matrix). LFM2's short
    # convolutions ("conv"; models/lfm2.py) keep only the conv window (over hidden_size channels): their heads
    # and head dims are 0, linear_conv_kernel the conv's taps. Granite 4.0-H's Mamba2 layers ("mamba";
    # models/granite_hybrid.py): key heads = n_groups, value heads = mamba heads, key head dim = mamba head_dim,
    # value head dim = d_state (a (heads, head_dim, d_state) state), the conv over d_inner + 2 n_groups d_state
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    linear_v_heads_tiled: bool = False  # value heads in llama.cpp's tiled order (a GGUF), not grouped (HF's)

    def layer_windows(self) -> list[int]:
        """Each layer's sliding window (0: the layer attends to every earlier key)."""
        if not self.sliding_window:  # None (or a GGUF's 0): no window
            return [0] * self.num_layers
        if not self.layer_types:
            return [self.sliding_window] * self.num_layers
        return [self.sliding_window if t == "sliding_attention" else 0 for t in self.layer_types]

    @property
    def uniform_window(self) -> int:
        """W when every layer is windowed by W (then KV older than the window is never read again), else 0."""
        windows = set(self.layer_windows())
        return windows.pop() if len(windows) == 1 else 0

    @property
    def linear_layers(self) -> list[int]:
        """The layers with a recurrent state instead of a KV cache (Qwen3.5's linear attention, LFM2's short
        convolutions)."""
        return [i for i, t in enumerate(self.layer_types) if t in ("linear_attention", "conv", "mamba")]

    @property
    def kv_layers(self) -> list[int]:
        """The layers with a KV cache, in order: the i-th of them uses the cache's layer i."""
        linear = set(self.linear_layers)
        return [i for i in range(self.num_layers) if i not in linear]

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a recurrent layer's causal conv: q, k and v (Qwen3.5), the hidden size (LFM2), x, B and C
        (Granite 4.0-H's Mamba2: d_inner + 2 n_groups d_state)."""
        if "conv" in self.layer_types:
            return self.hidden_size
        if "mamba" in self.layer_types:
            return self.linear_value_dim_mamba + 2 * self.linear_num_key_heads * self.linear_value_head_dim
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_value_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_value_dim_mamba(self) -> int:
        """Mamba2's d_inner: heads times head_dim (the pool's dk)."""
        return self.linear_num_value_heads * self.linear_key_head_dim

    def recurrent_state_bytes(self) -> int:
        """One sequence's recurrent state over every recurrent layer, float32: the conv's last K - 1 inputs and the
        delta rule's (value heads, dk, dv) matrix (none for LFM2). 0 for a model without such layers."""
        per_layer = (self.linear_conv_dim * (self.linear_conv_kernel - 1)
                     + self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim)
        return 4 * per_layer * len(self.linear_layers)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * len(self.kv_layers) * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_parameters(self, active: bool = False) -> int:
        """Every weight; with `active`, only those one token reads (num_experts_per_tok of the experts)."""
        d, v = self.hidden_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        matmuls = sum(n * k for layer in range(self.num_layers) for n, k in self._layer_shapes(active, layer))
        norms = d if self.architecture == "cohere2" else 2 * d  # Cohere2: one norm for both sublayers
        per_layer = norms + (2 * self.head_dim if self.qk_norm else 0)
        if self.architecture in ("olmo2", "olmo3", "olmoe"):  # q / k norms over the whole projection
            per_layer += q + kv
        bias = (q + 2 * kv) * self.num_layers if self.attention_bias else 0
        if self.architecture in ("gemma2", "gemma3", "glm4"):  # pre- and post-norms around both sublayers
            per_layer += 2 * d + (2 * self.head_dim if self.architecture == "gemma3" else 0)  # Gemma 3's q/k norms
        if self.architecture == "gpt_oss":  # o's bias, the sinks, the router's and the experts' biases
            experts = self.num_experts_per_tok if active else self.num_experts
            per_layer += d + self.num_heads + self.num_experts + experts * (2 * self.moe_intermediate_size + d)
        if self.moe_selection_bias:  # one per expert in each layer of experts
            bias += (self.num_layers - len(self.dense_mlp_layers)) * self.num_experts
        if self.linear_layers and "mamba" in self.layer_types:  # the conv, its bias, A_log, dt_bias, D, the norm
            per_linear = (self.linear_conv_dim * (self.linear_conv_kernel + 1) + 3 * self.linear_num_value_heads
                          + self.linear_value_dim_mamba - (2 * self.head_dim if self.qk_norm else 0))
            bias += per_linear * len(self.linear_layers)
        elif self.linear_layers:  # each linear layer: its conv, A_log, dt_bias and gated norm (LFM2: its conv); no q / k norms
            per_linear = (self.linear_conv_dim * self.linear_conv_kernel + 2 * self.linear_num_value_heads
                          + self.linear_value_head_dim - 2 * self.head_dim)
            bias += per_linear * len(self.linear_layers)
        return matmuls + self.num_layers * per_layer + bias + v * d * (1 if self.tie_word_embeddings else 2) + d

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of every matmul weight: per layer qkv, o, the MLP's (gate_up, down;
        with experts: the router, each expert's gate_up and down, and a shared expert with its gate), and
        the output layer when it is not tied to the embedding."""
        head = [] if self.tie_word_embeddings else [(self.vocab_size, self.hidden_size)]
        return [s for layer in range(self.num_layers) for s in self._layer_shapes(layer=layer)] + head

    def _layer_shapes(self, active: bool = False, layer: int = -1) -> list[tuple[int, int]]:
        d, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = [(q + 2 * kv, d), (d, q)]
        if self.architecture in ("lfm2", "lfm2_moe") and layer in self.linear_layers:  # the short conv's in (B|C|x) and out
            attn = [(3 * d, d), (d, d)]
        if self.architecture in _GRANITE_HYBRID and layer in self.linear_layers:  # Mamba2's in (z|xBC|dt) and out
            inner = self.linear_value_dim_mamba
            attn = [(inner + self.linear_conv_dim + self.linear_num_value_heads, d), (d, inner)]
        if self.architecture in _QWEN3_5:  # q with its output gate; a linear layer's q|k|v|z, b|a and out
            vd = self.linear_value_dim
            attn = ([(self.linear_conv_dim + vd, d), (2 * self.linear_num_value_heads, d), (d, vd)]
                    if layer in self.linear_layers else [(2 * q + 2 * kv, d), (d, q)])
            if not self.num_experts:
                return attn + [(2 * i, d), (d, i)]
        if not self.num_experts or layer in self.dense_mlp_layers:
            return attn + [(i if self.architecture == "arcee" else 2 * i, d), (d, i)]  # Arcee's MLP: no gate
        e, s = self.moe_intermediate_size, self.shared_expert_intermediate_size
        experts = [(2 * e, d), (d, e)] * (self.num_experts_per_tok if active else self.num_experts)
        shared = ([(2 * s, d), (d, s)] + ([(1, d)] if self.shared_expert_gated else [])) if s else []
        return attn + [(self.num_experts, d)] + experts + shared

    # -- readers ---------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], tensor_names: set[str], quantization: str) -> ModelConfig:
        arch = str(metadata.get("general.architecture", ""))  # the prefix of its metadata keys
        ours = architectures.from_gguf_name(arch, any(n.endswith(".ffn_gate_exps.weight") for n in tensor_names))

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
            if stype == "yarn":  # llama.cpp's n_ctx_orig_yarn falls back to the trained context too
                if not rope_scaling["original_max_position_embeddings"]:
                    rope_scaling["original_max_position_embeddings"] = int(get("context_length"))
                rope_scaling |= _yarn_gguf(metadata, arch, float(metadata.get(f"{arch}.rope.scaling.factor", 1.0)),
                                           log_multiplier_is_mscale=ours.name == "ministral3")
        if "rope_freqs.weight" in tensor_names:
            rope_scaling = {"rope_type": "gguf_rope_freqs"}  # per-frequency factors stored as a tensor
        family: dict[str, Any] = {}
        if ours.name == "gemma3":
            family = _gemma3_gguf(metadata, arch)
        elif ours.name == "gemma2":
            family = _gemma2_gguf(metadata, arch)
        elif ours.name == "mistral" and f"{arch}.attention.sliding_window" in metadata:  # a GGUF that kept it
            family = {"sliding_window": int(metadata[f"{arch}.attention.sliding_window"])}
        elif ours.name in ("granite", "granitemoe"):
            family = _granite_gguf(metadata, arch)
        elif ours.name in _GRANITE_HYBRID:
            family = _granite_gguf(metadata, arch) | _granite_hybrid_gguf(metadata, arch, int(get("block_count")))
        elif ours.name == "gemma":  # llama.cpp: GELU (tanh), embeddings times sqrt(n_embd)
            family = {"hidden_act": "gelu_pytorch_tanh", "embedding_multiplier": hidden ** 0.5}
        elif ours.name == "olmo2" and metadata.get(f"{arch}.attention.sliding_window"):
            # OLMo 3, which llama.cpp writes as olmo2 with windowed layers: 3 of 4 (llama.cpp's default period),
            # rotated with freq_base_swa (else the base) and without the rope scaling of the global ones
            ours = architectures.get("olmo3")
            family = {"sliding_window": int(metadata[f"{arch}.attention.sliding_window"]),
                      "layer_types": _gguf_layer_types(metadata, arch, 4),
                      "rope_local_theta": float(metadata.get(f"{arch}.rope.freq_base_swa",
                                                             metadata.get(f"{arch}.rope.freq_base", 10000.0)))}
        elif ours.name == "exaone4":
            family = _exaone4_gguf(metadata, arch, int(get("block_count")))
        elif ours.name == "ministral3":
            family = _ministral3_gguf(metadata, arch, rope_scaling)
        elif ours.name == "cohere2":
            family = _cohere2_gguf(metadata, arch, int(get("block_count")), head_dim)
        elif ours.name == "arcee":  # llama.cpp's arcee graph: relu(up) ** 2, no gate
            family = {"hidden_act": "relu2"}
        elif ours.name == "hunyuan_dense":  # llama.cpp's converter folded the NTK alpha into freq_base
            family = {"qk_norm_after_rotary": True}
        elif ours.name == "glm4":  # llama.cpp's rope.dimension_count: the rotating dims (half of each head)
            rotary = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
            family = {"rotary_dim": rotary if rotary != head_dim else None}
        elif ours.name == "gpt_oss":
            family = _gpt_oss_gguf(metadata, arch)
        elif ours.name == "ernie4_5_moe":
            family = _ernie4_5_moe_gguf(metadata, arch, int(get("block_count")), tensor_names)
        elif ours.name in _QWEN3_5:
            family = _qwen3_5_gguf(metadata, arch)
        elif ours.name == "lfm2":
            family = _lfm2_gguf(metadata, arch, int(get("block_count")))
        elif ours.name == "lfm2_moe":  # LFM2's layers; leading_dense_block_count dense MLPs, then experts
            family = _lfm2_gguf(metadata, arch, int(get("block_count"))) | {
                "dense_mlp_layers": tuple(range(int(metadata.get(f"{arch}.leading_dense_block_count", 0)))),
                "moe_selection_bias": any(x.endswith(".exp_probs_b.bias") for x in tensor_names)}
        elif ours.name == "smollm3":  # llama.cpp: every 4th layer (no GGUF key says otherwise)
            family = {"nope_layers": _every_nth(int(get("block_count")), _SMOLLM3_NOPE_INTERVAL)}
        cfg = cls(
            architecture=ours.name,
            vocab_size=int(vocab),
            hidden_size=hidden,
            # (a MoE without dense MLPs may have no feed_forward_length: Qwen3.5 MoE)
            intermediate_size=int(metadata.get(f"{arch}.feed_forward_length")
                                  or get("expert_feed_forward_length") if ours.is_moe else get("feed_forward_length")),
            num_layers=int(get("block_count")) - int(metadata.get(f"{arch}.nextn_predict_layers", 0)),
            num_heads=n_heads,
            num_kv_heads=int(n_kv if not hasattr(n_kv, "__len__") else max(n_kv)),
            head_dim=head_dim,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            rope_scaling=rope_scaling,
            name=str(metadata.get("general.name", "")),
            quantization=quantization,
            qk_norm=ours.name in _QK_NORM,  # a file without the norms then fails at load, naming them
            **(_gguf_moe_fields(metadata, arch, ours.name, tensor_names) if ours.is_moe else {}),
            **family,
        )
        if ours.name == "phi3":
            cfg = _phi3_from_gguf(cfg, metadata, arch, tensor_names)
        elif ours.name == "cohere2":  # LayerNorm's epsilon
            cfg = replace(cfg, rms_norm_eps=float(metadata.get(f"{arch}.attention.layer_norm_epsilon", 1e-5)))
        elif ours.name == "gpt_oss" and rope_scaling and rope_scaling["rope_type"] == "yarn":
            # the model's YaRN ramp is unrounded (HF's truncate: false, OpenAI's reference); a GGUF cannot say
            # so, and llama.cpp rounds it (a small difference in every position's rotation)
            cfg = replace(cfg, rope_scaling={**rope_scaling, "truncate": False})
        return cfg

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        cfg = json.loads((Path(path) / "config.json").read_text())
        archs = cfg.get("architectures") or []
        try:
            arch = architectures.from_hf_config(list(archs), cfg.get("model_type")).name
        except ValueError as e:
            raise ValueError(f"{path}/config.json: {e}") from None
        if arch in _QWEN3_5 and isinstance(cfg.get("text_config"), dict):  # the VL checkpoint: its language model
            cfg = {**cfg, **cfg["text_config"]}
        if arch == "lfm2":  # its own names for the common fields
            cfg = _lfm2_common(cfg)
        if arch == "lfm2_moe":  # LFM2's names; its dense MLP is intermediate_size as it is
            cfg = _lfm2_common({**cfg, "block_auto_adjust_ff_dim": False})
        if arch in _GRANITE_HYBRID:  # one HF class for both: the experts decide
            arch = "granite_hybrid_moe" if int(cfg.get("num_local_experts") or 0) else "granite_hybrid"
            if arch == "granite_hybrid":  # the dense MLP is the shared one
                cfg = {**cfg, "intermediate_size": cfg.get("shared_intermediate_size", 1024)}
        n_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        family: dict[str, Any] = {}
        if arch in ("qwen3", "qwen3moe", "qwen2moe", "mixtral", "olmoe", "granitemoe", *_GRANITE_HYBRID):
            _check_hf_features(cfg, arch, path)
            family["qk_norm"] = arch in _QK_NORM
        if architectures.get(arch).is_moe:
            family.update(_hf_moe_fields(cfg, arch))
        if arch == "ernie4_5_moe":
            family.update(_ernie4_5_moe_layers(cfg))
        common: dict[str, Any] = dict(
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            # transformers < 5 writes rope_scaling; 5.x folds it (and rope_theta) into rope_parameters
            rope_scaling=cfg.get("rope_scaling") or cfg.get("rope_parameters"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            hidden_act=str(cfg.get("hidden_act", "silu")),
        )
        try:
            if arch == "gemma3":
                common.update(_gemma3_hf(cfg))
            elif arch == "gemma2":
                common.update(_gemma2_hf(cfg))
            elif arch in ("granite", "granitemoe"):
                common.update(_granite_hf(cfg))
            elif arch in _GRANITE_HYBRID:
                common.update(_granite_hf(cfg) | _granite_hybrid_hf(cfg))
            elif arch == "smollm3":
                common.update(_smollm3_hf(cfg))
            elif arch == "exaone4":
                common.update(_exaone4_hf(cfg))
            elif arch in ("ernie4_5", "ernie4_5_moe"):
                common.update(_ernie4_5_hf(cfg))
            elif arch == "glm4":
                common.update(_glm4_hf(cfg, int(cfg.get("head_dim") or hidden // n_heads)))
            elif arch == "ministral3":
                common.update(_ministral3_hf(cfg))
            elif arch == "cohere2":
                common.update(_cohere2_hf(cfg, int(cfg["num_hidden_layers"])))
            elif arch == "arcee":  # ArceeConfig's default activation is relu2
                if cfg.get("attention_bias") or cfg.get("mlp_bias"):
                    raise ValueError("arcee with attention_bias or mlp_bias is not supported")
                common["hidden_act"] = str(cfg.get("hidden_act", "relu2"))
            elif arch == "hunyuan_dense":
                common.update(_hunyuan_hf(cfg, int(cfg.get("head_dim") or hidden // n_heads)))
            elif arch == "gemma":
                common.update(_gemma1_hf(cfg))
            elif arch == "gpt_oss":
                common.update(_gpt_oss_hf(cfg))
            elif arch == "olmo3":
                common.update(_olmo3_hf(cfg))
            elif arch in _QWEN3_5:
                common.update(_qwen3_5_hf(cfg, int(cfg.get("head_dim") or hidden // n_heads)))
            elif arch in ("lfm2", "lfm2_moe"):
                common.update(_lfm2_hf(cfg))
            elif arch in ("olmo2", "olmoe") and cfg.get("attention_bias"):  # HF's includes o_proj's, ours lacks it
                raise ValueError(f"{arch} with attention_bias is not supported")
            elif arch == "olmoe" and cfg.get("clip_qkv") is not None:
                raise ValueError("olmoe with clip_qkv is not supported")
            else:
                common.update(_sliding_window_hf(cfg, arch))
        except ValueError as e:
            raise ValueError(f"{path}/config.json: {e}") from None
        out = cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg.get("intermediate_size") or cfg["moe_intermediate_size"]),  # (Qwen3.5 MoE: no dense MLP)
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=n_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or hidden // n_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            attention_bias=bool(cfg.get("qkv_bias", True) if arch == "qwen2moe"  # Qwen2-MoE's name for it
                                else cfg.get("attention_bias", arch in ("qwen2", "glm4"))),
            name=str(cfg.get("_name_or_path", Path(path).name)),
            quantization=str(cfg.get("torch_dtype", cfg.get("dtype", "safetensors"))),
            **family,
            **common,
        )
        if arch == "phi3":
            out = _phi3_from_hf(out, cfg, Path(path))
        elif arch == "cohere2":  # LayerNorm's epsilon
            out = replace(out, rms_norm_eps=float(cfg.get("layer_norm_eps", 1e-5)))
        return out


# -- phi3 ------------------------------------------------------------------------------------------------
# Phi-3 / Phi-3.5 / Phi-4-mini: LongRoPE (short and long per-frequency factors, an attention factor on cos and
# sin), partial rotary (Phi-4-mini rotates 0.75 of each head) and a sliding window in the config. The rope
# scaling is normalised to {"rope_type": "longrope", "short_factor", "long_factor",
def _yarn_gguf(md: dict[str, Any], arch: str, factor: float, log_multiplier_is_mscale: bool = False) -> dict[str, Any]:
    """YaRN's optional GGUF keys as the HF config's fields (layers/rotary.py): the ramp's beta_fast /
    beta_slow, and the temperature on cos and sin, llama.cpp's yarn_attn_factor times YaRN's own 1 + 0.1
    ln(factor). An ext_factor other than 1 (a partial blend) or a log multiplier is refused (DeepSeek's), but
    for Ministral 3, whose converter writes its mscale_all_dim there (`log_multiplier_is_mscale`)."""
    key = f"{arch}.rope.scaling."
    out: dict[str, Any] = {}
    for name, field in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if md.get(key + name) is not None:
            out[field] = float(md[key + name])
    ext = md.get(key + "yarn_ext_factor")
    if ext is not None and float(ext) >= 0 and float(ext) != 1.0:
        raise ValueError(f"GGUF {key}yarn_ext_factor {ext} is not supported (1.0 only: the full YaRN blend)")
    log_mul = md.get(key + "yarn_log_multiplier")
    if log_mul and log_multiplier_is_mscale:  # Ministral 3: its mscale_all_dim, with mscale the same (1 in each)
        out["mscale"] = out["mscale_all_dim"] = float(log_mul)
    elif log_mul:
        raise ValueError(f"GGUF {key}yarn_log_multiplier is not supported")
    attn = md.get(key + "yarn_attn_factor")
    if attn is not None:
        out["attention_factor"] = float(attn) * (1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0)
    return out


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


# -- per-family readers: each returns the ModelConfig fields its family sets ---------------------------
_QWEN3_5 = ("qwen3_5", "qwen3_5_moe")
_GRANITE_HYBRID = ("granite_hybrid", "granite_hybrid_moe")
_QK_NORM = ("qwen3", "qwen3moe", "exaone4", "hunyuan_dense", "lfm2", "lfm2_moe", *_QWEN3_5)  # the families with per-head q/k RMSNorm
# llama.cpp's MoE graphs: Mixtral (arch "llama"), Qwen3-MoE and Granite MoE (softmax over the top-k logits)
# renormalize the chosen experts' weights, Qwen2-MoE and OLMoE do not; a file may say otherwise with
# {arch}.expert_weights_norm.
_GGUF_MOE_RENORMALIZE = {"mixtral": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False, "granitemoe": True,
                         "granite_hybrid_moe": True,
                         "gpt_oss": True, "ernie4_5_moe": True, "qwen3_5_moe": True, "lfm2_moe": True}
_GGUF_MOE_SIGMOID = ("lfm2_moe",)  # the families whose experts may be scored by sigmoid (expert_gating_func 2)


def _gguf_moe_fields(metadata: dict[str, Any], arch: str, ours: str, tensor_names: set[str]) -> dict[str, Any]:
    def get(key: str) -> Any:
        if f"{arch}.{key}" not in metadata:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return metadata[f"{arch}.{key}"]

    gating = int(metadata.get(f"{arch}.expert_gating_func", 1))  # llama.cpp: 1 softmax, 2 sigmoid
    sigmoid = gating == 2 and ours in _GGUF_MOE_SIGMOID
    if gating != 1 and not sigmoid:
        raise ValueError(f"GGUF {arch}.expert_gating_func {gating} is not supported (only 1, softmax)")
    if float(metadata.get(f"{arch}.expert_weights_scale", 1.0)) != 1.0:
        raise ValueError(f"GGUF {arch}.expert_weights_scale is not supported")
    ff = int(metadata.get(f"{arch}.feed_forward_length") or get("expert_feed_forward_length"))
    return dict(
        num_experts=int(get("expert_count")),
        num_experts_per_tok=int(get("expert_used_count")),
        moe_sigmoid=sigmoid,
        moe_intermediate_size=int(metadata.get(f"{arch}.expert_feed_forward_length", ff)),  # Mixtral: ff
        moe_renormalize=bool(metadata.get(f"{arch}.expert_weights_norm", _GGUF_MOE_RENORMALIZE[ours])),
        shared_expert_intermediate_size=int(metadata.get(f"{arch}.expert_shared_feed_forward_length", 0))
        if any(n.endswith(".ffn_gate_shexp.weight") for n in tensor_names) else 0,
        # Qwen2-MoE's shared expert sits behind a sigmoid gate (ffn_gate_inp_shexp); Granite MoE's and ERNIE's
        # have none
        shared_expert_gated=not any(n.endswith(".ffn_gate_shexp.weight") for n in tensor_names)
        or any(n.endswith(".ffn_gate_inp_shexp.weight") for n in tensor_names),
    )


def _check_hf_features(cfg: dict[str, Any], arch: str, path: str | Path) -> None:
    """Config features of the Qwen3 / MoE families that tokenmill does not implement: refuse, naming them."""
    unsupported = []
    if cfg.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act {cfg['hidden_act']!r}")
    if cfg.get("use_sliding_window") or (arch == "mixtral" and cfg.get("sliding_window") is not None):
        unsupported.append("sliding_window")
    if cfg.get("mlp_only_layers"):
        unsupported.append("mlp_only_layers (dense layers among the MoE ones)")
    if int(cfg.get("decoder_sparse_step", 1)) != 1:
        unsupported.append("decoder_sparse_step != 1 (dense layers among the MoE ones)")
    if unsupported:
        raise ValueError(f"{path}/config.json: {arch} with {', '.join(unsupported)} is not supported")


def _hf_moe_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    if arch == "ernie4_5_moe":  # its own names (transformers maps num_experts / num_experts_per_tok onto them)
        inter = int(cfg["moe_intermediate_size"])
        return dict(num_experts=int(cfg.get("moe_num_experts") or cfg["num_experts"]),
                    num_experts_per_tok=int(cfg.get("moe_k") or cfg["num_experts_per_tok"]),
                    moe_intermediate_size=inter, moe_renormalize=True, moe_selection_bias=True,
                    shared_expert_intermediate_size=inter * int(cfg.get("moe_num_shared_experts") or 0),
                    shared_expert_gated=False)
    if arch == "lfm2_moe":  # sigmoid scores, chosen with expert_bias, after num_dense_layers dense layers
        return dict(num_experts=int(cfg["num_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                    moe_renormalize=bool(cfg.get("norm_topk_prob", True)),
                    moe_selection_bias=bool(cfg.get("use_expert_bias", True)), moe_sigmoid=True,
                    moe_routed_scaling=float(cfg.get("routed_scaling_factor") or 1.0),
                    dense_mlp_layers=tuple(range(int(cfg.get("num_dense_layers", 2)))))
    # Qwen's configs say num_experts; transformers 5 writes Qwen3-MoE's as num_local_experts, as Mixtral's
    num_experts = int(cfg.get("num_local_experts") or cfg["num_experts"])
    if arch in ("mixtral", "granitemoe", "granite_hybrid_moe"):  # softmax over all, top-k, renormalized (= softmax over the top-k logits)
        return dict(num_experts=num_experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), moe_renormalize=True,
                    # GraniteMoeShared: an ungated shared expert of shared_intermediate_size (0: none)
                    shared_expert_intermediate_size=int(cfg.get("shared_intermediate_size") or 0),
                    shared_expert_gated=not cfg.get("shared_intermediate_size"))
    if arch == "gpt_oss":  # top-k by logit, softmax over the chosen (= softmax, top-k, renormalized)
        return dict(num_experts=num_experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), moe_renormalize=True)
    if arch == "qwen3_5_moe":  # softmax, top-k, always renormalized; a shared expert behind a sigmoid gate
        return dict(num_experts=num_experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["moe_intermediate_size"]), moe_renormalize=True,
                    shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0))
    if arch == "olmoe":  # its intermediate_size is each expert's; softmax, top-k, renormalized if norm_topk_prob
        return dict(num_experts=num_experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]),
                    moe_renormalize=bool(cfg.get("norm_topk_prob", False)))
    return dict(num_experts=num_experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                moe_renormalize=bool(cfg.get("norm_topk_prob", False)),
                shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
                if arch == "qwen2moe" else 0)


def _sliding_window_hf(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Mistral's `sliding_window` windows every layer (HF masks with it whenever it is set)."""
    if arch == "mistral" and cfg.get("sliding_window"):
        return {"sliding_window": int(cfg["sliding_window"])}
    if arch == "qwen2" and cfg.get("use_sliding_window"):
        raise ValueError("Qwen2's use_sliding_window (windows from max_window_layers on) is not supported")
    return {}


def _gemma3_pattern(num_layers: int, pattern: int) -> tuple[str, ...]:
    """HF's and llama.cpp's rule: every `pattern`-th layer (the last of each group) is global."""
    return tuple("sliding_attention" if pattern and (i + 1) % pattern else "full_attention"
                 for i in range(num_layers))


def _hf_layer_types(cfg: dict[str, Any], arch: str, pattern: int) -> tuple[str, ...]:
    """A Gemma config's layer types: its own, else every `pattern`-th layer global; checked against its layers."""
    n = int(cfg["num_hidden_layers"])
    types = tuple(cfg.get("layer_types") or _gemma3_pattern(n, pattern))
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"{arch} layer_types {types} are not {n} of sliding_attention / full_attention")
    return types


def _gguf_query_pre_attn_scalar(md: dict[str, Any], arch: str, big_layers: int) -> float:
    """gemma_pytorch's rule, as llama.cpp applies it (a GGUF has no key for it): the 27B (`big_layers` layers)
    scales by hidden / heads, the others by head_dim."""
    n = int(md[f"{arch}.block_count"])
    hidden, heads = int(md[f"{arch}.embedding_length"]), int(md[f"{arch}.attention.head_count"])
    return float(hidden // heads if n == big_layers else md.get(f"{arch}.attention.key_length", hidden // heads))


def _gemma3_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma3TextConfig: layer types (or sliding_window_pattern), per-type rope parameters, attention scalar."""
    for key in ("attn_logit_softcapping",):
        if cfg.get(key) is not None:
            raise ValueError(f"gemma3 {key} is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("gemma3 use_bidirectional_attention is not supported")
    types = _hf_layer_types(cfg, "gemma3", int(cfg.get("sliding_window_pattern", 6)))
    params = cfg.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"gemma3 rope scaling {local['rope_type']!r} on the local layers is not supported")
    theta = float(full.pop("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
    scaling = full if full.get("rope_type", "default") != "default" else cfg.get("rope_scaling")
    return {
        "sliding_window": int(cfg.get("sliding_window") or 0) or None,
        "layer_types": types,
        "rope_theta": theta,
        "rope_local_theta": float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))),
        "rope_scaling": scaling,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", 256)),
        "final_logit_softcapping": float(cfg.get("final_logit_softcapping") or 0.0),
        "hidden_act": str(cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


# gpt-oss: windowed layers (the even ones, 128 keys) between global ones, attention sinks, biased experts on a
# clamped SwiGLU (models/gpt_oss.py)
def _gpt_oss_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    window = cfg.get("sliding_window")
    return {"sliding_window": int(window) if window else None,
            "layer_types": _hf_layer_types(cfg, "gpt_oss", 2),
            "swiglu_alpha": float(cfg.get("swiglu_alpha", 1.702)),
            "swiglu_limit": float(cfg.get("swiglu_limit", 7.0))}


def _olmo3_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Olmo3Config: windowed layers (layer_types, else 3 of 4), and rotary per layer type: transformers 5's
    rope_parameters has an entry for each, transformers 4's rope_theta / rope_scaling are the global layers'
    (the windowed ones: the same base, no scaling). Scaling on the windowed layers is refused."""
    if cfg.get("attention_bias"):
        raise ValueError("olmo3 with attention_bias is not supported")
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp:
        full, local = dict(rp["full_attention"] or {}), dict(rp.get("sliding_attention") or {})
    else:
        theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        full = dict(cfg.get("rope_scaling") or {"rope_type": "default"}) | {"rope_theta": theta}
        local = {"rope_type": "default", "rope_theta": theta}
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ValueError("olmo3 with rope scaling on its sliding-window layers is not supported")
    theta = float(full.get("rope_theta", 10000.0))
    window = cfg.get("sliding_window")
    return {"rope_theta": theta, "rope_local_theta": float(local.get("rope_theta", theta)),
            "rope_scaling": None if full.get("rope_type", full.get("type", "default")) == "default" else full,
            "sliding_window": int(window) if window else None, "layer_types": _hf_layer_types(cfg, "olmo3", 4)}


def _gpt_oss_gguf(md: dict[str, Any], arch: str) -> dict[str, Any]:
    """llama.cpp's openai-moe hparams: the window from the GGUF, every 2nd layer global unless the file says
    otherwise (attention.sliding_window_pattern); the SwiGLU's alpha and limit are its constants."""
    return {"sliding_window": int(md.get(f"{arch}.attention.sliding_window", 0)) or None,
            "layer_types": _gguf_layer_types(md, arch, 2)}


# Qwen3.5: three Gated DeltaNet layers to one of gated attention (layer_types, else every full_attention_interval-th
# layer full), q / k norms, a quarter of each head rotated (its interleaved M-RoPE is plain rotary on text alone)
def _qwen3_5_hf(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    n = int(cfg["num_hidden_layers"])
    interval = int(cfg.get("full_attention_interval", 4))
    types = tuple(cfg.get("layer_types") or ("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                            for i in range(n)))
    if len(types) != n or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"qwen3_5 layer_types {types} are not {n} of linear_attention / full_attention")
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"qwen3_5 with rope scaling {rope.get('rope_type')!r} is not supported")
    rotary = int(head_dim * float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))))
    return {"layer_types": types, "qk_norm": True, "rotary_dim": rotary if rotary != head_dim else None,
            "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))), "rope_scaling": None,
            "linear_num_key_heads": int(cfg["linear_num_key_heads"]),
            "linear_num_value_heads": int(cfg["linear_num_value_heads"]),
            "linear_key_head_dim": int(cfg["linear_key_head_dim"]),
            "linear_value_head_dim": int(cfg["linear_value_head_dim"]),
            "linear_conv_kernel": int(cfg.get("linear_conv_kernel_dim", 4))}


def _qwen3_5_gguf(md: dict[str, Any], arch: str) -> dict[str, Any]:
    """llama.cpp's qwen35 hparams: the ssm.* keys (state_size = dk = dv, group_count = key heads, time_step_rank =
    value heads), attention.recurrent_layers' flags or every full_attention_interval-th layer full; its converter
    reorders the value heads into tiled order where there are more of them than key heads."""
    n = int(md[f"{arch}.block_count"]) - int(md.get(f"{arch}.nextn_predict_layers", 0))
    flags = md.get(f"{arch}.attention.recurrent_layers")
    if flags is not None and hasattr(flags, "__len__"):
        types = tuple("linear_attention" if bool(x) else "full_attention" for x in list(flags)[:n])
    else:
        interval = int(md.get(f"{arch}.full_attention_interval", 4))
        types = tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n))
    head_dim = int(md.get(f"{arch}.attention.key_length", 0)) or (
        int(md[f"{arch}.embedding_length"]) // int(md[f"{arch}.attention.head_count"]))
    rotary = int(md.get(f"{arch}.rope.dimension_count", head_dim))
    state, groups, heads = (int(md[f"{arch}.ssm.{k}"]) for k in ("state_size", "group_count", "time_step_rank"))
    return {"layer_types": types, "rotary_dim": rotary if rotary != head_dim else None,
            "linear_num_key_heads": groups, "linear_num_value_heads": heads, "linear_key_head_dim": state,
            "linear_value_head_dim": int(md[f"{arch}.ssm.inner_size"]) // heads,
            "linear_conv_kernel": int(md[f"{arch}.ssm.conv_kernel"]), "linear_v_heads_tiled": groups != heads}


# LFM2: short-conv layers (a gated depthwise conv of conv_L_cache taps, a recurrent state) between GQA layers
def _lfm2_common(cfg: dict[str, Any]) -> dict[str, Any]:
    """Lfm2Config's names for the common fields (norm_eps, tie_embedding, block_ff_dim; rope_theta 1e6 by default),
    and its MLP's width as transformers' Lfm2MLP computes it: with block_auto_adjust_ff_dim, 2/3 of the config's,
    times block_ffn_dim_multiplier rounded up to block_multiple_of (when there is a multiplier)."""
    ff = int(cfg.get("intermediate_size") or cfg["block_ff_dim"])
    if cfg.get("block_auto_adjust_ff_dim", True):
        ff = int(2 * ff / 3)
        mult = cfg.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            multiple = int(cfg.get("block_multiple_of", 256))
            ff = multiple * ((int(mult * ff) + multiple - 1) // multiple)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", cfg.get("theta", 1e6)))
    return {**cfg, "intermediate_size": ff, "rms_norm_eps": float(cfg.get("norm_eps", 1e-5)), "rope_theta": theta,
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", cfg.get("tie_embedding", True)))}


def _lfm2_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """layer_types (else full_attn_idxs: those full, the rest conv), the conv's taps (conv_L_cache); no conv bias,
    no rope scaling."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        full = set(cfg.get("full_attn_idxs") or range(n))
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    types = tuple(types)
    if len(types) != n or set(types) - {"conv", "full_attention"}:
        raise ValueError(f"lfm2 layer_types {types} are not {n} of conv / full_attention")
    if cfg.get("conv_bias"):
        raise ValueError("lfm2 with conv_bias is not supported")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"lfm2 with rope scaling {rope.get('rope_type')!r} is not supported")
    return {"layer_types": types, "qk_norm": True, "rope_scaling": None,
            "linear_conv_kernel": int(cfg.get("conv_L_cache", 3))}


def _lfm2_gguf(md: dict[str, Any], arch: str, n: int) -> dict[str, Any]:
    """llama.cpp's converter marks the conv layers by a head_count_kv of 0 in its per-layer array, and writes the
    conv's taps as shortconv.l_cache."""
    kv = md.get(f"{arch}.attention.head_count_kv", md[f"{arch}.attention.head_count"])
    kv = list(kv) if hasattr(kv, "__len__") else [kv] * n
    if md.get(f"{arch}.attention.sliding_window"):
        raise ValueError(f"GGUF {arch} with attention.sliding_window is not supported")
    return {"layer_types": tuple("conv" if int(k) == 0 else "full_attention" for k in kv[:n]),
            "linear_conv_kernel": int(md[f"{arch}.shortconv.l_cache"])}


def _gguf_layer_types(md: dict[str, Any], arch: str, default_pattern: int) -> tuple[str, ...]:
    """llama.cpp's windowed layers: attention.sliding_window_pattern's per-layer flags (True: windowed), or its
    period (every n-th layer global), else the family's period."""
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is not None and hasattr(pattern, "__len__"):
        return tuple("sliding_attention" if bool(x) else "full_attention" for x in pattern)
    return _gemma3_pattern(int(md[f"{arch}.block_count"]), default_pattern if pattern is None else int(pattern))


def _gemma3_gguf(md: dict[str, Any], arch: str) -> dict[str, Any]:
    """llama.cpp's gemma3 hparams: the GGUF stores the window; the layer pattern (6), the local rotary
    base (10000) and the attention scale are llama.cpp's constants (src/llama-model.cpp)."""
    if md.get(f"{arch}.attn_logit_softcapping") is not None:
        raise ValueError("gemma3 attn_logit_softcapping is not supported")
    return {
        "sliding_window": int(md[f"{arch}.attention.sliding_window"]) or None,
        "layer_types": _gguf_layer_types(md, arch, 6),
        "rope_local_theta": 10_000.0,
        "query_pre_attn_scalar": _gguf_query_pre_attn_scalar(md, arch, 62),  # the 27B: 62 layers
        "final_logit_softcapping": float(md.get(f"{arch}.final_logit_softcapping") or 0.0),
        "hidden_act": "gelu_pytorch_tanh",
    }


# Gemma 2: Gemma 3's layer (norms before and after each sublayer, (1 + w) norms, GELU-tanh, tied and
# sqrt(hidden)-scaled embeddings) without the per-head q/k norms, with attention scores soft-capped
# (cap * tanh(s / cap), 50) as well as the logits (30), local and global layers alternating (local first,
# window 4096), and one rotary base for both.
def _gemma2_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma2Config: layer types (else alternating), the window, the soft-caps, the attention scalar."""
    types = _hf_layer_types(cfg, "gemma2", 2)
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise ValueError(f"gemma2 rope scaling {params.get('rope_type', params.get('type'))!r} is not supported")
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10_000.0)
    return {
        "sliding_window": int(cfg.get("sliding_window") or 0) or None,
        "layer_types": types,
        "rope_theta": theta,
        "rope_local_theta": theta,
        "rope_scaling": None,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", 256)),
        "final_logit_softcapping": float(cfg.get("final_logit_softcapping") or 0.0),
        "attn_logit_softcapping": float(cfg.get("attn_logit_softcapping") or 0.0),
        "hidden_act": str(cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
    }


def _gemma2_gguf(md: dict[str, Any], arch: str) -> dict[str, Any]:
    """llama.cpp's gemma2 hparams: the window and the soft-caps from the file (50 and 30 where it lacks them,
    llama.cpp's defaults), every other layer local from the first, the attention scale by gemma_pytorch's
    rule."""
    attn_cap, final_cap = md.get(f"{arch}.attn_logit_softcapping"), md.get(f"{arch}.final_logit_softcapping")
    return {
        "sliding_window": int(md.get(f"{arch}.attention.sliding_window", 4096)) or None,
        "layer_types": _gemma3_pattern(int(md[f"{arch}.block_count"]), 2),
        "rope_local_theta": float(md.get(f"{arch}.rope.freq_base", 10_000.0)),
        "query_pre_attn_scalar": _gguf_query_pre_attn_scalar(md, arch, 46),  # the 27B: 46 layers
        "attn_logit_softcapping": float(50.0 if attn_cap is None else attn_cap),
        "final_logit_softcapping": float(30.0 if final_cap is None else final_cap),
        "hidden_act": "gelu_pytorch_tanh",
    }


# -- granite, smollm3 -----------------------------------------------------------------------------------
_SMOLLM3_NOPE_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step for smollm3 (a constant there), HF's default


def _every_nth(num_layers: int, n: int) -> tuple[int, ...]:
    """The layers (i + 1) % n == 0: HF's no_rope_layer_interval rule, llama.cpp's n_no_rope_layer_step."""
    return tuple(i for i in range(num_layers) if (i + 1) % n == 0)


def _smollm3_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """SmolLM3's NoPE layers: `no_rope_layers` lists 1 (rotate) or 0 (not) per layer; without it, every
    `no_rope_layer_interval`-th layer skips rotary. Its sliding window is refused (no checkpoint uses it)."""
    for key in ("use_sliding_window", "attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"smollm3 with {key} is not supported")
    n = int(cfg["num_hidden_layers"])
    flags = cfg.get("no_rope_layers")
    if flags is None:
        return {"nope_layers": _every_nth(n, int(cfg.get("no_rope_layer_interval") or _SMOLLM3_NOPE_INTERVAL))}
    if len(flags) != n:
        raise ValueError(f"smollm3 no_rope_layers has {len(flags)} entries for {n} layers")
    return {"nope_layers": tuple(i for i, f in enumerate(flags) if not f)}


def _cohere2_hf(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """Cohere2's windowed layers (layer_types, else every sliding_window_pattern-th global; the global ones
    without rotary), logit_scale as logits_scaling's reciprocal, its tied head by default."""
    for key in ("attention_bias", "use_qk_norm"):
        if cfg.get(key):
            raise ValueError(f"cohere2 with {key} is not supported")
    if float(cfg.get("rotary_pct", 1.0)) != 1.0:
        raise ValueError("cohere2 with rotary_pct other than 1 is not supported")
    if not cfg.get("sliding_window"):  # (HF then rotates no layer at all; no checkpoint is so)
        raise ValueError("cohere2 without a sliding_window is not supported")
    types = cfg.get("layer_types")
    pattern = int(cfg.get("sliding_window_pattern") or 4)
    sliding = [t == "sliding_attention" for t in types] if types else [(i + 1) % pattern != 0 for i in range(n)]
    return _windowed_nope_fields(cfg.get("sliding_window"), sliding) | {
        "qk_norm": False, "logits_scaling": 1.0 / float(cfg.get("logit_scale", 0.0625)),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}


def _cohere2_gguf(md: dict[str, Any], arch: str, n: int, head_dim: int) -> dict[str, Any]:
    """llama.cpp's cohere2 keys: logit_scale, attention.sliding_window (every 4th layer global, as its graph
    fixes it, unless a sliding_window_pattern says otherwise)."""
    if int(md.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"GGUF {arch} with partial rotary is not supported")
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    sliding = [bool(p) for p in pattern] if isinstance(pattern, list) else [(i + 1) % 4 != 0 for i in range(n)]
    window = int(md.get(f"{arch}.attention.sliding_window") or 0)
    if not window:
        raise ValueError(f"GGUF {arch} without attention.sliding_window is not supported")
    return {k: v for k, v in _windowed_nope_fields(window, sliding).items() if k != "qk_norm"} | {
        "logits_scaling": 1.0 / float(md.get(f"{arch}.logit_scale", 1.0))}


def _ministral3_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ministral 3's attention temperature (rope_parameters' llama_4_scaling_beta over its
    original_max_position_embeddings) and a sliding window if the config has one (every layer, as Mistral)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    out: dict[str, Any] = {}
    beta = params.get("llama_4_scaling_beta")
    if beta:
        original = params.get("original_max_position_embeddings") or cfg.get("max_position_embeddings") or 0
        if int(original) <= 0:
            raise ValueError("ministral3's llama_4_scaling_beta needs original_max_position_embeddings")
        out |= {"attn_temperature_scale": float(beta), "attn_temperature_length": int(original)}
    if cfg.get("sliding_window"):
        out["sliding_window"] = int(cfg["sliding_window"])
    return out


def _ministral3_gguf(md: dict[str, Any], arch: str, rope_scaling: dict[str, Any] | None) -> dict[str, Any]:
    """llama.cpp's mistral3 keys: attention.temperature_scale, over attention.temperature_length or else the
    original context (rope.scaling.original_context_length, as its graph takes it)."""
    scale = float(md.get(f"{arch}.attention.temperature_scale") or 0.0)
    if not scale:
        return {}
    length = int(md.get(f"{arch}.attention.temperature_length") or (rope_scaling or {}).get(
        "original_max_position_embeddings") or md.get(f"{arch}.context_length") or 0)
    if length <= 0:
        raise ValueError(f"GGUF {arch}.attention.temperature_scale without a length to scale positions by")
    return {"attn_temperature_scale": scale, "attn_temperature_length": length}


def _hunyuan_hf(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """Hunyuan's per-head q / k norms after rotary, and its "dynamic" rope with a fixed NTK alpha, which is
    static (transformers' ntk_alpha): the base becomes theta * alpha ** (hd / (hd - 2)), no other scaling."""
    for key in ("attention_bias", "mlp_bias"):  # HF's include o_proj's / the MLP's, which ours lack
        if cfg.get(key):
            raise ValueError(f"hunyuan_dense with {key} is not supported")
    out: dict[str, Any] = {"qk_norm": True, "qk_norm_after_rotary": True}
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    kind = params.get("rope_type") or params.get("type")
    if kind == "dynamic" and params.get("alpha"):
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        out |= {"rope_theta": theta * float(params["alpha"]) ** (head_dim / (head_dim - 2)), "rope_scaling": None}
    elif kind not in (None, "default"):
        raise ValueError(f"hunyuan_dense with rope scaling {kind!r} is not supported (supported: default, "
                         "dynamic with alpha)")
    return out


def _glm4_hf(cfg: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """GLM-4's partial rotary (partial_rotary_factor, 0.5 by default; top level or in rope_parameters)."""
    if cfg.get("mlp_bias"):
        raise ValueError("glm4 with mlp_bias is not supported")
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5)))
    rotary = int(head_dim * partial)
    return {"rotary_dim": rotary if rotary != head_dim else None}


def _ernie4_5_moe_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """ERNIE 4.5 MoE's dense layers: those outside moe_layer_start_index .. moe_layer_end_index, or off its
    interval (HF's rule)."""
    n = int(cfg["num_hidden_layers"])
    start, end = int(cfg.get("moe_layer_start_index", 0)), cfg.get("moe_layer_end_index")
    end, step = n - 1 if end is None or int(end) < 0 else int(end), int(cfg.get("moe_layer_interval", 1))
    return {"dense_mlp_layers": tuple(i for i in range(n) if not ((i + 1) % step == 0 and start <= i <= end))}


def _ernie4_5_moe_gguf(md: dict[str, Any], arch: str, n: int, tensor_names: set[str]) -> dict[str, Any]:
    """llama.cpp's ernie4_5-moe: leading_dense_block_count dense layers, then experts every
    interleave_moe_layer_step-th layer; the selection bias (exp_probs_b) where the file has it."""
    lead = int(md.get(f"{arch}.leading_dense_block_count", 0))
    step = int(md.get(f"{arch}.interleave_moe_layer_step", 1))
    return {"dense_mlp_layers": tuple(i for i in range(n) if not (i >= lead and (i + 1) % step == 0)),
            "moe_selection_bias": any(x.endswith(".exp_probs_b.bias") for x in tensor_names)}


def _ernie4_5_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """ERNIE 4.5's use_bias covers every projection (o_proj and the MLP's too, which ours lack); its head is tied
    unless the config says otherwise (Ernie4_5Config's default)."""
    if cfg.get("use_bias"):
        raise ValueError("ernie4_5 with use_bias is not supported")
    return {"tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}


def _windowed_nope_fields(window: int | None, sliding: list[bool]) -> dict[str, Any]:
    """EXAONE 4's and Cohere2's layers: with a window, the sliding ones windowed and rotated, the others global
    without rotary; without one, every layer global and rotated (EXAONE 4's rule in HF and llama.cpp)."""
    if not window:
        return {"qk_norm": True}
    return {"qk_norm": True, "sliding_window": window,
            "layer_types": tuple("sliding_attention" if s else "full_attention" for s in sliding),
            "nope_layers": tuple(i for i, s in enumerate(sliding) if not s)}


def _exaone4_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """layer_types, else sliding_window_pattern: "LLLG"-style letters repeated, or every n-th layer global."""
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"exaone4 with {key} is not supported")
    n, window = int(cfg["num_hidden_layers"]), cfg.get("sliding_window")
    if not window:
        return _windowed_nope_fields(None, [])
    types, pattern = cfg.get("layer_types"), cfg.get("sliding_window_pattern", 4)
    if types:
        sliding = [t == "sliding_attention" for t in types]
    elif isinstance(pattern, str):
        sliding = [pattern[i % len(pattern)] == "L" for i in range(n)]
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(n)]
    if len(sliding) != n:
        raise ValueError(f"exaone4 layer_types has {len(sliding)} entries for {n} layers")
    return _windowed_nope_fields(int(window), sliding)


def _exaone4_gguf(md: dict[str, Any], arch: str, n: int) -> dict[str, Any]:
    """llama.cpp's {arch}.attention.sliding_window and .sliding_window_pattern (one bool a layer, true:
    sliding); a window without a pattern: every 4th layer global (its converter's default)."""
    window = int(md.get(f"{arch}.attention.sliding_window") or 0)
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    sliding = [bool(p) for p in pattern] if pattern is not None else [(i + 1) % 4 != 0 for i in range(n)]
    if window and len(sliding) != n:
        raise ValueError(f"GGUF {arch}.attention.sliding_window_pattern has {len(sliding)} entries for {n} layers")
    return {k: v for k, v in _windowed_nope_fields(window or None, sliding).items() if k != "qk_norm"}


def _granite_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite's four multipliers, under HF's names (1.0 each where the config leaves one out, as HF does)."""
    for key in ("attention_bias", "mlp_bias"):  # HF's biases there include o_proj's / down_proj's, which ours lack
        if cfg.get(key):
            raise ValueError(f"granite with {key} is not supported")
    return dict(embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                attention_multiplier=float(cfg.get("attention_multiplier", 1.0)),
                residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
                logits_scaling=float(cfg.get("logits_scaling", 1.0)))


def _granite_gguf(md: dict[str, Any], arch: str) -> dict[str, Any]:
    """llama.cpp's granite keys: {arch}.embedding_scale, .residual_scale, .attention.scale, .logit_scale; a
    missing one is llama.cpp's default (1, 1, head_dim ** -0.5, 1)."""
    def get(key: str, default: float) -> float:
        v = md.get(f"{arch}.{key}")
        return default if v is None else float(v)

    return dict(embedding_multiplier=get("embedding_scale", 1.0), attention_multiplier=get("attention.scale", 0.0),
                residual_multiplier=get("residual_scale", 1.0), logits_scaling=get("logit_scale", 1.0))


# -- granite 4.0-H (GraniteMoeHybrid) ------------------------------------------------------------------
# Mamba2 layers among GQA attention layers (layer_types "mamba" / "attention", transformers 5 also writes them as
# "linear_attention" / "full_attention"), Granite's multipliers, attention rotated only with position_embedding_type
# "rope" (the released ones: "nope")
_MAMBA_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "full_attention",
                "full_attention": "full_attention"}


def _granite_hybrid_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    n, hidden = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    raw = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n
    if len(raw) != n or set(raw) - set(_MAMBA_TYPES):
        raise ValueError(f"granitemoehybrid layer_types {raw} are not {n} of mamba / attention")
    if cfg.get("mamba_proj_bias"):
        raise ValueError("granitemoehybrid with mamba_proj_bias is not supported")
    limit = cfg.get("time_step_limit")
    if limit is not None:  # (0, inf), transformers' default, is a no-op after softplus; JSON may spell inf as a dict
        hi = limit[1]["__float__"] if isinstance(limit[1], dict) else limit[1]
        if float(limit[0]) != 0.0 or float(hi) != float("inf"):
            raise ValueError(f"granitemoehybrid with time_step_limit {limit} is not supported")
    heads = int(cfg.get("mamba_n_heads", 128))
    inner = int(cfg.get("mamba_expand", 2)) * hidden
    head_dim = cfg.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if heads * head_dim != inner:
        raise ValueError(f"granitemoehybrid mamba_n_heads {heads} x mamba_d_head {head_dim} != d_inner {inner}")
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"granitemoehybrid with rope scaling {rope.get('rope_type')!r} is not supported")
    types = tuple(_MAMBA_TYPES[t] for t in raw)
    return {"layer_types": types, "rope_scaling": None,
            "nope_layers": () if cfg.get("position_embedding_type") == "rope" else tuple(range(n)),
            "linear_num_key_heads": int(cfg.get("mamba_n_groups", 1)), "linear_num_value_heads": heads,
            "linear_key_head_dim": head_dim, "linear_value_head_dim": int(cfg.get("mamba_d_state", 256)),
            "linear_conv_kernel": int(cfg.get("mamba_d_conv", 4))}


def _granite_hybrid_gguf(md: dict[str, Any], arch: str, n: int) -> dict[str, Any]:
    """llama.cpp's granitehybrid hparams: a head_count_kv of 0 marks a Mamba2 layer; ssm.* keys (time_step_rank =
    heads, inner_size = d_inner, state_size, group_count, conv_kernel); rope.scaling.finetuned switches rotary on
    (its converter writes false for Granite 4.0-H, which is NoPE; absent: true, as llama.cpp reads it)."""
    kv = md.get(f"{arch}.attention.head_count_kv", md[f"{arch}.attention.head_count"])
    kv = list(kv) if hasattr(kv, "__len__") else [kv] * n
    heads, inner = int(md[f"{arch}.ssm.time_step_rank"]), int(md[f"{arch}.ssm.inner_size"])
    rope = bool(md.get(f"{arch}.rope.scaling.finetuned", True))
    return {"layer_types": tuple("mamba" if int(k) == 0 else "full_attention" for k in kv[:n]),
            "nope_layers": () if rope else tuple(range(n)),
            "linear_num_key_heads": int(md[f"{arch}.ssm.group_count"]), "linear_num_value_heads": heads,
            "linear_key_head_dim": inner // heads, "linear_value_head_dim": int(md[f"{arch}.ssm.state_size"]),
            "linear_conv_kernel": int(md[f"{arch}.ssm.conv_kernel"])}


# -- gemma (the first generation) -------------------------------------------------------------------------
def _gemma1_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma's activation (hidden_activation, else hidden_act: the first configs said "gelu" and meant the
    tanh form, which transformers then used and llama.cpp computes), its tied head (GemmaConfig's default),
    embeddings times sqrt(hidden)."""
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh")
    if cfg.get("attention_bias"):  # HF's includes an o_proj bias, which ours lacks
        raise ValueError("gemma with attention_bias is not supported")
    return {"hidden_act": "gelu_pytorch_tanh" if act == "gelu" else act,
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True)),
            "embedding_multiplier": float(cfg["hidden_size"]) ** 0.5}
