"""bf16 compute, the `--dtype auto` choice on CPUs with AMX (and on CUDA). bf16 matmuls pick kernels by
batch size, so bf16 outputs are not bit-identical between batched and alone (as in vLLM); these tests
hold bf16 to closeness: to the fp32 transformers reference, to our fp32 engine, and batched to alone.
Exact invariances are tested in fp32 (test_invariance.py)."""

from __future__ import annotations

import pytest
import torch
from raw_forward import prompt_logits

from tokenmill import LLM, SamplingParams
from tokenmill.platforms import cpu_bf16_is_fast

pytestmark = pytest.mark.skipif(not cpu_bf16_is_fast(), reason="bf16 is ~300x slower than fp32 without AMX or AVX512_BF16")

SUBJECTS = ["the ocean", "a violin", "bread", "Mars", "a lighthouse", "chess", "winter", "a river",
            "volcanoes", "the printing press", "honeybees", "a library", "glaciers", "jazz", "the moon", "trains"]
PROMPTS = [f"Write two sentences about {s}." for s in SUBJECTS]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def bf16_llm() -> LLM:
    return LLM(progress=False, kv_cache_memory=64 * 2**20, max_model_len=1024, dtype="bfloat16",
               quantization="dequantize")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_auto_picks_bf16_here(bf16_llm: LLM) -> None:
    from tokenmill.config import EngineConfig
    from tokenmill.platforms import resolve_platform

    assert resolve_platform(EngineConfig(device="cpu")).dtype == torch.bfloat16
    assert bf16_llm.engine.executor.worker.runner.kv[0].dtype == torch.bfloat16  # the cache is bf16 too: half the bytes
    assert bf16_llm.engine.plan.dtype_bytes == 2


def test_bf16_prompt_logits_close_to_fp32(bf16_llm: LLM, llm: LLM) -> None:
    """Teacher-forced through a prompt, bf16 logits stay near fp32's and pick the same token almost
    everywhere (fp32 is itself held to transformers in test_reference.py)."""
    text = ("def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[0]\n"
            "The capital of France is Paris. In 1969, Neil Armstrong walked on the moon. 1, 1, 2, 3, 5, 8,")
    ids = llm.tokenizer.encode(text)
    ref, got = prompt_logits(llm, ids), prompt_logits(bf16_llm, ids)
    assert torch.isfinite(got).all()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    p_ref, p_got = ref.log_softmax(-1).exp(), got.log_softmax(-1).exp()
    tv = 0.5 * (p_ref - p_got).abs().sum(-1)  # total variation distance per position
    assert tv.mean().item() < 0.05 and tv.max().item() < 0.3, tv


def test_bf16_greedy_stays_close_to_fp32(bf16_llm: LLM, llm: LLM) -> None:
    ref = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    got = [o.outputs[0].token_ids for o in bf16_llm.generate(PROMPTS, GREEDY)]
    prefixes = [common_prefix(r, g) for r, g in zip(ref, got)]
    assert sum(p >= 4 for p in prefixes) >= 12, prefixes


def test_bf16_batched_close_to_alone(bf16_llm: LLM) -> None:
    batched = [o.outputs[0].token_ids for o in bf16_llm.generate(PROMPTS, GREEDY)]
    alone = [bf16_llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    prefixes = [common_prefix(a, b) for a, b in zip(batched, alone)]
    assert sum(p >= 4 for p in prefixes) >= 13, prefixes
    assert bf16_llm.engine.block_manager.num_free_blocks == bf16_llm.engine.plan.num_blocks


def test_server_at_the_default_dtype_answers() -> None:
    """`tokenmill serve` with no --dtype runs bf16 here, says so in its log, and answers sensibly."""
    import sys
    from pathlib import Path

    import httpx

    sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
    from server_process import ServerProcess

    srv = ServerProcess("--dtype", "auto").wait_ready()
    try:
        r = httpx.post(f"{srv.url}/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "1, 2, 3, 4,",
                                                           "max_tokens": 8, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].strip().startswith("5"), r.json()
    finally:
        assert srv.stop() == 0
    assert "bfloat16" in srv.output() or "bf16" in srv.output(), srv.output()


def test_prepacked_weights_match_plain(bf16_llm: LLM, monkeypatch) -> None:
    """bf16 on CPU prepacks the matmul weights for oneDNN; the logits are those of plain F.linear."""
    assert bf16_llm.engine.executor.worker.model.model.layers[0].self_attn.qkv_proj.packed is not None  # the default here is prepacked
    monkeypatch.setenv("TOKENMILL_PREPACK", "0")
    plain = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=512, dtype="bfloat16",
                quantization="dequantize")
    assert plain.engine.executor.worker.model.model.layers[0].self_attn.qkv_proj.packed is None
    ids = plain.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    a, b = prompt_logits(bf16_llm, ids), prompt_logits(plain, ids)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.95
    assert (a - b).abs().max().item() < 0.1, (a - b).abs().max().item()  # identical on the dev machine
