"""Teacher-forced logits of a whole prompt through an engine's model (the paged prefill path), for
comparisons against references. It writes K/V straight into blocks 0..n of the engine's cache behind
the block manager's back, so it then drops the prefix cache: no later request may hit those blocks."""

from __future__ import annotations

import torch

from tokenmill import LLM


def prompt_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of every prompt position."""
    from tokenmill.layers.attention import AttentionMetadata, PrefillChunk

    eng = llm.engine
    assert not eng.has_unfinished_requests(), "the raw forward would overwrite a running request's blocks"
    T, bs = len(ids), eng.config.block_size
    blocks = list(range(-(-T // bs)))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([blocks[p // bs] * bs + p % bs for p in range(T)]), num_decodes=0,
        decode_block_tables=None, decode_mask=None, prefills=[PrefillChunk(0, T, 0, torch.tensor(blocks))])
    try:
        with torch.inference_mode():
            hidden = eng.model(torch.tensor(ids), torch.arange(T), meta, eng.runner.kv_caches)
            return eng.model.compute_logits(hidden)
    finally:
        eng.block_manager.reset_prefix_cache()
