"""The memory arithmetic, done before anything is allocated: weights, KV per token, what fits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenmill.compute import (VNNI_PACKED_NOT_EXPERTS, ComputeChoice, Matrix, held_type, linear_weight_bytes,
                               stored_matrix_bytes, vnni_packed_bytes)
from tokenmill.config import format_size
from tokenmill.loader.model_config import ModelConfig


# What the process itself takes besides weights and KV cache: Python, torch, tokenmill and a tokenizer.
# Measured 2026-12-01 on torch 2.13 CPU: 225 MiB after the imports, ~300 MiB with a 150k-token vocabulary.
RUNTIME_BYTES = 300 * 2**20


class CacheTooSmallError(ValueError):
    """The settings cannot work: the message says which setting to change and to what."""


@dataclass(frozen=True)
class MemoryPlan:
    num_parameters: int
    weight_bytes: int  # in memory, at the compute dtype
    dtype_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_cache_bytes: int  # the budget asked for
    num_blocks: int
    max_model_len: int
    extra_weight_bytes: int = 0  # a prepacked copy of a tied output layer; the gguf method's dense copy
    linear_method: str = "unquantized"
    sliding_window: int = 0  # W > 0: every layer windowed by W, so blocks older than the window are freed
    max_chunk_tokens: int = 0  # the scheduler's token budget (a prefill chunk's most); 0: not known
    # speculative decoding's draft model: its weights, and its share of kv_bytes_per_token (its own cache
    # in the same blocks: every block holds both models' K/V for its tokens)
    draft_weight_bytes: int = 0
    draft_kv_bytes_per_token: int = 0
    # a model with recurrent layers (Qwen3.5's linear attention): each running sequence holds a state of
    # state_bytes_per_seq; num_state_slots of them come out of kv_cache_bytes first, and at most that many
    # sequences run at once; num_state_checkpoints more hold states at block boundaries for prefix caching
    # (engine/state_cache.py)
    state_bytes_per_seq: int = 0
    num_state_slots: int = 0
    num_state_checkpoints: int = 0

    @property
    def max_blocks_per_decoding_seq(self) -> int:
        """Blocks a decoding sequence holds at most: the whole context, or with a window on every layer the
        blocks its last W keys span, ceil((W - 1) / bs) + 1, wherever the window's edge falls."""
        whole = -(-self.max_model_len // self.block_size)
        if not self.sliding_window:
            return whole
        return min(whole, -(-(self.sliding_window - 1) // self.block_size) + 1)

    @property
    def max_seq_tokens(self) -> int:
        """KV tokens one sequence can need at once: max_model_len, or with a window on every layer (and a
        known chunk size) the window's blocks plus one prefill chunk's, if that is less."""
        if not self.sliding_window or not self.max_chunk_tokens:
            return self.max_model_len
        blocks = self.max_blocks_per_decoding_seq + -(-self.max_chunk_tokens // self.block_size)
        return min(self.max_model_len, blocks * self.block_size)

    @property
    def total_bytes(self) -> int:
        """What the process should take at its peak: weights, the whole KV cache, the runtime."""
        return (self.weight_bytes + self.extra_weight_bytes + self.draft_weight_bytes
                + self.num_blocks * self.kv_bytes_per_block + self.state_bytes + RUNTIME_BYTES)

    @property
    def state_bytes(self) -> int:
        return (self.num_state_slots + self.num_state_checkpoints) * self.state_bytes_per_seq

    def with_draft(self, draft: MemoryPlan) -> MemoryPlan:
        """This plan with a draft model beside the target (speculative decoding's draft_model): its weights
        added, its K/V per token added to every block's, so the same budget holds fewer blocks."""
        per_token = self.kv_bytes_per_token + draft.kv_bytes_per_token
        return dataclasses.replace(self, kv_bytes_per_token=per_token,
                                   num_blocks=self.kv_cache_bytes // (per_token * self.block_size),
                                   draft_weight_bytes=draft.weight_bytes + draft.extra_weight_bytes,
                                   draft_kv_bytes_per_token=draft.kv_bytes_per_token)

    @property
    def kv_bytes_per_block(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def num_cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_full_length_seqs(self) -> float:
        return self.num_cache_tokens / self.max_model_len

    def lines(self) -> list[str]:
        return [
            f"weights: {self.num_parameters / 1e6:.1f}M parameters, {format_size(self.weight_bytes)} "
            + (f"as ggml blocks ({self.linear_method}; norms at {self.dtype_bytes * 8}-bit)"
               if self.linear_method.startswith("gguf") else
               f"at {self.dtype_bytes * 8}-bit" + ("" if self.linear_method == "unquantized" else
                                                   f" ({self.linear_method} matmul weights)"))
            + ("" if not self.extra_weight_bytes else
               f" + {format_size(self.extra_weight_bytes)} (a dense copy at {self.dtype_bytes * 8}-bit for batches "
               "past the block kernels' crossover: --dense-copy)" if self.linear_method.startswith("gguf") else
               f" + {format_size(self.extra_weight_bytes)} ({self.linear_method} copy of the tied output layer)"),
            *([f"draft model (speculative decoding): {format_size(self.draft_weight_bytes)} weights, "
               f"{format_size(self.draft_kv_bytes_per_token)} of the KV cache's per-token bytes below"]
              if self.draft_weight_bytes else []),
            f"KV cache: {format_size(self.kv_bytes_per_token)} per token, "
            f"{format_size(self.kv_bytes_per_block)} per {self.block_size}-token block",
            f"KV cache: {format_size(self.num_blocks * self.kv_bytes_per_block)} -> {self.num_blocks} blocks = "
            f"{self.num_cache_tokens} tokens",
            *([f"recurrent state (the recurrent layers' conv windows and states): "
               f"{format_size(self.state_bytes_per_seq)} per sequence x "
               f"({self.num_state_slots} sequences at once + {self.num_state_checkpoints} prefix-cache checkpoints) = "
               f"{format_size(self.state_bytes)}, from the KV cache's budget"
               + ("" if self.num_state_checkpoints else "; no prefix caching (a state cannot be rebuilt from cached "
                  "blocks without a checkpoint of it)")]
              if self.state_bytes_per_seq else []),
            f"max_model_len {self.max_model_len}: {self.max_full_length_seqs:.1f} sequences of full length fit at once",
            *([f"sliding window {self.sliding_window} on every layer: a decoding sequence holds at most "
               f"{self.max_blocks_per_decoding_seq} blocks ({self.max_blocks_per_decoding_seq * self.block_size} "
               f"tokens) of KV however long it grows (older blocks are freed; a prefill chunk adds its own)"]
              if self.sliding_window else []),
            f"process total: {format_size(self.total_bytes)} (weights + {'draft + ' if self.draft_weight_bytes else ''}"
            f"KV cache + {format_size(RUNTIME_BYTES)} for "
            "Python, torch and the tokenizer)",
        ]

    def check(self) -> None:
        if self.num_blocks < 1 or self.max_seq_tokens > self.num_cache_tokens:
            need = self.max_seq_tokens * self.kv_bytes_per_token
            what = f"max_model_len {self.max_model_len}" + (
                f" (at most {self.max_seq_tokens} tokens held under the sliding window {self.sliding_window})"
                if self.max_seq_tokens < self.max_model_len else "")
            raise CacheTooSmallError(
                f"{what} needs {format_size(need)} of KV cache for one sequence, "
                f"but the cache holds {self.num_cache_tokens} tokens ({format_size(self.kv_cache_bytes)} at "
                f"{format_size(self.kv_bytes_per_token)} per token"
                + (f", after {format_size(self.state_bytes)} of one sequence's recurrent state" if self.state_bytes
                   else "") + "). Raise --kv-cache-memory to at least "
                f"{format_size(need + self.kv_bytes_per_block + self.state_bytes)}" + (
                    f", or lower --max-model-len to at most {self.num_cache_tokens}." if self.num_cache_tokens > 0
                    else " (it holds not one block).")
            )


def _meminfo(key: str, default: int) -> int:
    """One /proc/meminfo field in bytes (no torch needed); default if it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return default


def available_ram() -> int:
    """MemAvailable; 4 GiB if it cannot be read."""
    return _meminfo("MemAvailable", 4 * 2**30)


def total_ram() -> int:
    """MemTotal; 0 if it cannot be read (then nothing that needs a share of it is kept)."""
    return _meminfo("MemTotal", 0)


def dense_copy_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes of the gguf method's dense copy: every matmul weight (experts included) and the output layer,
    tied or not, at the compute dtype."""
    head = [(cfg.vocab_size, cfg.hidden_size)] if cfg.tie_word_embeddings else []
    return sum(n * k for n, k in [*cfg.linear_shapes(), *head]) * dtype_bytes


def _gguf_matrix_bytes(cfg: ModelConfig, compute: ComputeChoice, m: Matrix, is_head: bool) -> int:
    """Bytes the gguf method holds for one of the file's matrices: its blocks, or their packed layout where
    compute.vnni_pack repacks the matrices of a linear layer (layers/ggml_linear.py, _packs): the decoder's and
    the output layer's (`is_head`; a tied embedding gathers from those), not an untied embedding's, nor a
    mixture of experts' of the types its one-call path takes (VNNI_PACKED_NOT_EXPERTS)."""
    n, k, stored_type = m.rows, m.k, m.type
    if compute.vnni_pack and (is_head or (n, k) != (cfg.vocab_size, cfg.hidden_size)):
        stored_type = held_type(stored_type, compute.requant_type, k)  # (re)quantized at load first
        packed = None if m.expert and stored_type in VNNI_PACKED_NOT_EXPERTS else vnni_packed_bytes(n, k, stored_type)
        if packed is not None:
            return packed
    return stored_matrix_bytes("gguf", n, k, stored_type, compute.requant_type)


def default_kv_cache_bytes(is_cuda: bool, free_bytes: int) -> int:
    """A sensible share of free memory: on a GPU 90% of what is free after the weights, less 2 GiB for
    activations; on CPU a quarter of available RAM, at most 2 GiB (CPU decode is bandwidth-bound long
    before a bigger cache would fill)."""
    if is_cuda:
        return max(int(free_bytes * 0.9) - 2 * 2**30, free_bytes // 2)
    return min(free_bytes // 4, 2 * 2**30)


CUDA_ACTIVATION_BYTES = 2 * 2**30  # what default_kv_cache_bytes leaves a GPU's steps


def kv_bytes_for_gpu_share(share: float, total: int, free: int, weight_bytes: int) -> int:
    """vLLM's --gpu-memory-utilization: this process may use `share` of the GPU's `total` memory, of which
    other processes hold `total - free` now and its weights will take `weight_bytes`; the KV cache gets what
    is left after CUDA_ACTIVATION_BYTES for the steps. A ValueError that says why when nothing is left."""
    kv = int(share * total) - (total - free) - weight_bytes - CUDA_ACTIVATION_BYTES
    if kv <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {share}: {format_size(int(share * total))} of the GPU's {format_size(total)} "
            f"leaves nothing for the KV cache after {format_size(total - free)} already in use, "
            f"{format_size(weight_bytes)} of weights and {format_size(CUDA_ACTIVATION_BYTES)} for activations: "
            "raise it, or give --kv-cache-memory")
    return kv


def make_plan(cfg: ModelConfig, compute: ComputeChoice, block_size: int, kv_cache_bytes: int,
              max_model_len: int, matrices: list[Matrix] | None = None,
              max_chunk_tokens: int = 0, max_num_seqs: int = 1, state_checkpoints: int | None = None) -> MemoryPlan:
    """The plan of `_weights_and_cache`, then, for a model with recurrent layers, states taken from the KV cache's
    budget first: `state_checkpoints` for prefix caching (None: as many as a quarter of the budget holds, at most
    max_num_seqs; 0: prefix caching is off), then those of up to max_num_seqs running sequences, as many as leave
    the cache one sequence of max_model_len (at least one, checkpoints given up for it)."""
    plan = _weights_and_cache(cfg, compute, block_size, kv_cache_bytes, max_model_len, matrices, max_chunk_tokens)
    per_seq = cfg.recurrent_state_bytes()
    if not per_seq:
        return plan
    one_seq = (-(-plan.max_seq_tokens // block_size) + 1) * plan.kv_bytes_per_block
    room = max(0, (kv_cache_bytes - one_seq) // per_seq)  # states that leave the cache one full-length sequence
    ckpts = min(max_num_seqs, kv_cache_bytes // 4 // per_seq) if state_checkpoints is None else state_checkpoints
    ckpts = max(0, min(ckpts, room - 1))
    slots = max(1, min(max_num_seqs, room - ckpts))
    blocks = max(0, kv_cache_bytes - (slots + ckpts) * per_seq) // plan.kv_bytes_per_block
    return dataclasses.replace(plan, num_blocks=blocks, state_bytes_per_seq=per_seq, num_state_slots=slots,
                               num_state_checkpoints=ckpts)


def _weights_and_cache(cfg: ModelConfig, compute: ComputeChoice, block_size: int, kv_cache_bytes: int,
                       max_model_len: int, matrices: list[Matrix] | None = None,
                       max_chunk_tokens: int = 0) -> MemoryPlan:
    """Weight bytes come from the linear method (compute.linear_weight_bytes): every matmul weight is
    stored as the method stores it, everything else (embedding, norms, biases) at the compute dtype. A
    tied output layer shares the embedding, unless the method keeps its own converted copy.

    The gguf method keeps every 2-D checkpoint tensor (embedding included) as ggml blocks: `matrices`
    lists them as (out, in, stored type, e.g. "q4_k" or "f32"), from the GGUF header (GGUFFile.matrices);
    without it (an HF checkpoint) they are the config's matmul shapes and the embedding, stored as f32.
    A tied output layer multiplies by the embedding's own blocks. Where the method repacks blocks for the
    16-bit VNNI kernel (compute.vnni_pack: the decoder's and the output layer's), those matrices count at the
    packed size."""
    per_token = cfg.kv_bytes_per_token(compute.dtype_bytes)
    method, nbytes = compute.linear_method, compute.dtype_bytes
    if method == "gguf":
        mats = matrices if matrices is not None else [
            Matrix(n, k, "f32") for n, k in [*cfg.linear_shapes(), (cfg.vocab_size, cfg.hidden_size)]]
        # the output layer's matrix: the last (vocab, hidden) one (tied: the embedding's, the only one)
        head = max((i for i, m in enumerate(mats) if (m.rows, m.k) == (cfg.vocab_size, cfg.hidden_size)), default=-1)
        stored = sum(_gguf_matrix_bytes(cfg, compute, m, i == head) for i, m in enumerate(mats))
        rest = (cfg.num_parameters() - sum(m.rows * m.k for m in mats)) * nbytes  # norms, biases
        return MemoryPlan(cfg.num_parameters(), stored + max(rest, 0), nbytes, per_token, block_size,
                          kv_cache_bytes, kv_cache_bytes // (per_token * block_size), max_model_len,
                          extra_weight_bytes=dense_copy_bytes(cfg, nbytes) if compute.dense_copy else 0,
                          linear_method=(method if compute.requant_type is None else f"gguf {compute.requant_type}")
                          + (", Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL packed for the VNNI kernel"
                             if compute.vnni_pack else ""),
                          sliding_window=cfg.uniform_window, max_chunk_tokens=max_chunk_tokens)
    shapes = cfg.linear_shapes()
    linear = sum(linear_weight_bytes(method, n, k, nbytes) for n, k in shapes)
    rest = (cfg.num_parameters() - sum(n * k for n, k in shapes)) * nbytes  # embedding, norms, biases
    head = (0 if method == "unquantized" else linear_weight_bytes(method, cfg.vocab_size, cfg.hidden_size, nbytes)) \
        if cfg.tie_word_embeddings else 0
    return MemoryPlan(
        num_parameters=cfg.num_parameters(),
        weight_bytes=linear + rest,
        dtype_bytes=nbytes,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        kv_cache_bytes=kv_cache_bytes,
        num_blocks=kv_cache_bytes // (per_token * block_size),
        max_model_len=max_model_len,
        extra_weight_bytes=head,
        linear_method=method,
        sliding_window=cfg.uniform_window,
        max_chunk_tokens=max_chunk_tokens,
    )
