"""Teacher-forced logits of a whole prompt through an engine's model (the paged prefill path), for
comparisons against references. It writes K/V straight into blocks 0..n of the engine's cache behind
the block manager's back, so it then drops the prefix cache: no later request may hit those blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def exact_engine(path: str | Path, max_model_len: int = 256, **kw: Any) -> LLM:
    """An engine that is exact against an fp32 reference on the same weights: fp32, dequantized."""
    args: dict[str, Any] = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=max_model_len,
                                dtype="float32", quantization="dequantize")
    args.update(kw)
    return LLM(str(path), **args)


def greedy_reference(model: Any, ids: list[int], n: int) -> list[int]:
    """n greedy tokens from a transformers model, a whole forward per token (no cache to trust)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def widen_and_save(model: Any, tokenizer: Any, out: Path) -> None:
    """A tiny random transformers model made usable as a reference, then saved as an HF directory with the
    default model's tokenizer: its init is tiny, so matrices get N(0, 0.08) and norms U(0.5, 1.5) (well
    separated logits)."""
    import json

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            else:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": tokenizer.chat_template}))
