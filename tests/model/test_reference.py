"""Greedy tokens and prompt logits of the default model against an independent implementation:
HF transformers loading the same GGUF (it dequantises and un-permutes on its own), fed the same ids."""

from __future__ import annotations

import pytest
import torch
from raw_forward import prompt_logits

from tokenmill import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n",
    "Translate to German: The weather is nice today.",
    "1, 1, 2, 3, 5, 8, 13,",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "In 1969, Neil Armstrong",
]
NUM_TOKENS = 32


def reference_greedy(model, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        x = torch.tensor([ids])
        out = model(x, use_cache=True)
        prompt_logits = out.logits[0]
        past = out.past_key_values
        tok = int(prompt_logits[-1].argmax())
        gen = [tok]
        for _ in range(n - 1):
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
    return gen, prompt_logits


def test_greedy_tokens_match_transformers(llm, reference) -> None:
    tok = llm.tokenizer
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    ours = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True))
    for ids, out in zip(prompt_ids, ours):
        ref, _ = reference_greedy(reference, ids, NUM_TOKENS)
        assert out.outputs[0].token_ids == ref, f"prompt {tok.decode(ids)!r} diverged"


def test_prompt_logits_match_transformers(llm, reference) -> None:
    """All positions' logits of a prompt, computed through the paged prefill path."""
    ids = llm.tokenizer.encode(PROMPTS[1] + PROMPTS[3])
    ours = prompt_logits(llm, ids)
    with torch.inference_mode():
        ref = reference(torch.tensor([ids])).logits[0]
    assert torch.allclose(ours, ref, atol=1e-3, rtol=0), float((ours - ref).abs().max())
