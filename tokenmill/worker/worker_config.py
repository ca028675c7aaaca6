"""WorkerConfig: everything a worker needs to build its model, cache and runner. Plain, picklable data."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.config import EngineConfig
from tokenmill.loader.model_config import ModelConfig
from tokenmill.loader.model_source import ModelSource


@dataclass(frozen=True)
class DraftConfig:
    """The model that drafts tokens for speculative decoding (worker/drafter.py).

    draft_model: a second model (`source`, `model_config`, its own linear method) with its own KV cache of
    the target's num_blocks and block_size; layer_skip: `source` is None and the target's first
    `num_layers` layers draft, over the target's cache."""

    source: ModelSource | None = None
    model_config: ModelConfig | None = None
    linear_method: str = "unquantized"
    requant_type: str | None = None
    num_layers: int | None = None  # layer_skip


@dataclass(frozen=True)
class WorkerConfig:
    engine_config: EngineConfig
    source: ModelSource  # where the weights are
    model_config: ModelConfig
    device: str  # e.g. "cpu", "cuda:0" (the platform decided)
    dtype: str  # float32 | bfloat16 | float16
    linear_method: str  # compute.LINEAR_METHODS
    requant_type: str | None  # gguf method: quantize unquantized matrices at load to this ggml type
    dense_copy: bool  # gguf method: also a dense copy of each matmul weight for big batches
    attention_backend: str  # attention/registry.py
    decode_mirror_bytes: int  # the decode_mirror backend's memory budget
    num_blocks: int  # KV cache blocks (the memory plan's)
    max_model_len: int
    eog_token_ids: frozenset[int]
    progress: bool = True
    draft: DraftConfig | None = None  # speculative decoding with a model-based drafter
    num_state_slots: int = 0  # a model with recurrent layers: sequences whose state it holds at once
    vnni_pack: bool = False  # gguf method: blocks packed for the 16-bit VNNI kernel (compute.vnni_packs)
