"""Teacher-forced logits of a whole prompt through an engine's model (the paged prefill path), for
comparisons against references. It writes K/V straight into blocks 0..n of the engine's cache behind
the block manager's back, so it then drops the prefix cache: no later request may hit those blocks."""

from __future__ import annotations

import torch

from tokenmill import LLM


def prompt_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of every prompt position."""
    from tokenmill.attention.backend import AttentionContext, AttentionStep, ScheduledSeq

    eng = llm.engine
    assert not eng.has_unfinished_requests(), "the raw forward would overwrite a running request's blocks"
    T, bs = len(ids), eng.config.block_size
    runner = eng.executor.worker.runner
    step = AttentionStep(decodes=[], prefills=[ScheduledSeq("raw", 0, T, list(range(-(-T // bs))))])
    attn = AttentionContext(runner.attn_backend, runner.attn_backend.build_metadata(step), runner.kv_caches)
    try:
        with torch.inference_mode():
            hidden = runner.model.forward(torch.tensor(ids), torch.arange(T), attn)
            return runner.model.compute_logits(hidden)
    finally:
        eng.block_manager.reset_prefix_cache()
