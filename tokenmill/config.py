"""Frozen configuration, built once from CLI flags or keyword arguments and validated up front."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "t": 10**12, "tb": 10**12}


def parse_size(value: str | int | None) -> int | None:
    """'2GiB' -> 2147483648; '512MB' -> 512000000; plain ints are bytes."""
    if value is None or isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if re.fullmatch(r"\s*-.*", str(value)):
        raise ValueError(f"a size must be positive, got {value!r}")
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {value!r} as a size: use a number with a unit, like 2GiB or 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num_bytes) < 1024 or unit == "TiB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    raise AssertionError


# -- speculative decoding -------------------------------------------------------------------------------
METHODS = ("ngram", "draft_model", "layer_skip")
# num_speculative_tokens when the config leaves it out: prompt lookup's drafts cost nothing to make and the
# adaptive draft length trims them, so its ceiling is higher (a verbatim copy then goes 7 tokens a step; on
# the grounded code edit, 6 gave 1.87-1.90x against 1.76-1.77x with 4, 8 gave 1.74-1.89x: benchmarks/
# README.md); a model drafts one token per forward, so the model-based methods keep 4
DEFAULT_NUM_SPECULATIVE_TOKENS = {"ngram": 6, "draft_model": 4, "layer_skip": 4}


@dataclass(frozen=True)
class SpeculativeConfig:
    """`--speculative-config` (JSON, vLLM's field names where they exist), validated once:

        {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
        {"method": "draft_model", "model": "/models/small.gguf", "num_speculative_tokens": 4}
        {"method": "layer_skip", "num_draft_layers": 8, "num_speculative_tokens": 3}

    method "ngram": prompt lookup. The last n tokens (n from prompt_lookup_max down to prompt_lookup_min)
    are looked up in the prompt and the output so far; the tokens that followed their latest earlier
    occurrence are the draft. No second model.
    method "draft_model": `model` (a .gguf file or an HF directory with the target's tokenizer) drafts
    greedily; it has its own KV cache, in the same blocks and the same memory plan as the target's.
    method "layer_skip" (ours): the target's own first `num_draft_layers` layers, its final norm and its
    output head draft greedily; they share the target's KV cache (those layers' keys and values are the
    target's own), so it costs no memory. Default: a quarter of the layers.

    Our additions, the rule that keeps speculation where it pays (engine/spec_decode.py):
        max_batch_size        draft only while at most this many requests run (a big batch is
                              compute-bound on a CPU: drafts then only add work)
        draft_length          "adaptive" (default): each request drafts the number of tokens, up to
                              num_speculative_tokens, that its recent acceptance and the measured cost of
                              a step's rows say gives the most tokens per second, and pauses when none
                              pays; "fixed": always num_speculative_tokens, as vLLM does
        min_acceptance_rate   a request whose estimated acceptance falls below this also pauses (default
                              0: the cost decides)
        backoff_steps         a pause's length in steps (each consecutive pause twice as long, up to 16x)
    """
    method: str = "ngram"
    num_speculative_tokens: int | None = None  # None: the method's default (DEFAULT_NUM_SPECULATIVE_TOKENS)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None  # draft_model: the draft's path
    # draft_model: how its weights run, as --quantization ("auto": a GGUF keeps its blocks); None: the target's
    quantization: str | None = None
    num_draft_layers: int | None = None  # layer_skip: the target's layers the draft runs (None: a quarter)
    max_batch_size: int = 2
    draft_length: str = "adaptive"
    min_acceptance_rate: float = 0.0
    backoff_steps: int = 16

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.num_speculative_tokens is None:
            object.__setattr__(self, "num_speculative_tokens", DEFAULT_NUM_SPECULATIVE_TOKENS[self.method])
        if not 1 <= self.max_drafts <= 16:
            raise ValueError(f"num_speculative_tokens must be between 1 and 16, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min} and "
                             f"{self.prompt_lookup_max}")
        if self.method == "draft_model" and not self.model:
            raise ValueError('speculative method "draft_model" needs "model": the draft model\'s path')
        if self.method != "draft_model" and self.model is not None:
            raise ValueError(f'"model" is the draft_model method\'s field; method is {self.method!r}')
        if self.quantization is not None:
            from tokenmill.compute import QUANTIZATION_CHOICES

            if self.method != "draft_model" or self.quantization not in ("auto", *QUANTIZATION_CHOICES):
                raise ValueError(f"quantization is the draft_model method's field, one of auto, "
                                 f"{', '.join(QUANTIZATION_CHOICES)}; got {self.quantization!r} with method "
                                 f"{self.method!r}")
        if self.num_draft_layers is not None and (self.method != "layer_skip" or self.num_draft_layers < 1):
            raise ValueError("num_draft_layers is the layer_skip method's field and must be at least 1, got "
                             f"{self.num_draft_layers} with method {self.method!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.draft_length not in ("adaptive", "fixed"):
            raise ValueError(f'draft_length must be "adaptive" or "fixed", got {self.draft_length!r}')
        if self.backoff_steps < 1:
            raise ValueError(f"backoff_steps must be at least 1, got {self.backoff_steps}")
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")

    @property
    def max_drafts(self) -> int:
        """num_speculative_tokens, the method's default filled in."""
        assert self.num_speculative_tokens is not None  # __post_init__ fills it
        return self.num_speculative_tokens

    @property
    def uses_model(self) -> bool:
        """The drafts come from a model run by the workers (not from the engine's prompt lookup)."""
        return self.method != "ngram"

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """From the flag's JSON text (or a dict); None stays None. Unknown fields are an error naming them."""
        if value is None:
            return None
        try:
            data = json.loads(value) if isinstance(value, str) else dict(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"--speculative-config is not valid JSON ({e}): {value!r}") from None
        if not isinstance(data, dict):
            raise ValueError("--speculative-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown speculative-config field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start. Values found at run time (number of KV blocks) are not
    written back here; they travel as return values."""

    model: str = "default"
    max_model_len: int | None = None  # None: the model's context length
    kv_cache_memory: int | None = None  # bytes; None: a share of free memory (see platforms)
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # None: the platform's (compute.default_token_budget)
    enable_prefix_caching: bool = True
    # a model with recurrent layers (Qwen3.5, LFM2): states kept at block boundaries for prefix caching
    # (engine/state_cache.py); None: as many as a quarter of the KV cache's budget holds, at most max_num_seqs
    state_checkpoints: int | None = None
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on CUDA and on CPUs with AMX, else fp32) | float32 | bfloat16 | float16
    seed: int = 0
    num_threads: int | None = None  # CPU threads for torch; None: all cores
    # None: a GGUF file on CPU keeps its blocks (ggml), anything else is at the compute dtype; "dequantize":
    # GGUF dequantized at load; "int8": weight-only int8 (torch); "q8_0", "q4_k", ...: requantized by ggml
    quantization: str | None = None
    # the gguf method's dense copy of the matmul weights for big batches: auto | on | off
    # (compute.choose_dense_copy says when auto keeps it)
    dense_copy: str = "auto"
    speculative_config: SpeculativeConfig | None = None  # None: no speculative decoding
    # vLLM's --chat-template: a Jinja file's path or the template itself, replacing the model's own
    chat_template: str | None = None
    # vLLM's --gpu-memory-utilization (CUDA only): the share of the GPU's memory this engine may take; sizes
    # the KV cache when kv_cache_memory does not (memory_plan.kv_bytes_for_gpu_share)
    gpu_memory_utilization: float | None = None
    # vLLM's --generation-config: the sampling defaults requests that leave a field out get (sampling_defaults.py):
    # auto (the model's own: generation_config.json, a GGUF's general.sampling.*), vllm (none), or a directory
    generation_config: str = "auto"
    # vLLM's --override-generation-config: generation_config.json keys set on top of those defaults
    override_generation_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.state_checkpoints is not None and self.state_checkpoints < 0:
            raise ValueError(f"state_checkpoints must be at least 0, got {self.state_checkpoints}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory}")
        if self.override_generation_config is not None:
            from tokenmill.sampling_defaults import check_override

            if not isinstance(self.override_generation_config, dict):
                raise ValueError("override_generation_config must be a JSON object, e.g. {\"temperature\": 0.5}")
            check_override(self.override_generation_config)
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        from tokenmill.compute import DENSE_COPY_CHOICES, QUANTIZATION_CHOICES

        if self.quantization is not None and self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)} or unset, "
                             f"got {self.quantization!r}")
        if self.dense_copy not in DENSE_COPY_CHOICES:
            raise ValueError(f"dense_copy must be one of {', '.join(DENSE_COPY_CHOICES)}, got {self.dense_copy!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
