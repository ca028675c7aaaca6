"""Invariances under greedy decoding: what the scheduler does must never change the tokens.
batched == alone, prefix cache on == off, preempted == not, chunked prefill == whole, n=4 seeded
reproducible. Exact in fp32 (the `llm` fixture and every engine here); bf16 matmuls pick kernels by
batch size, so bf16 is held to closeness instead (test_bf16.py)."""

from __future__ import annotations

import pytest

from tokenmill import LLM, SamplingParams

SUBJECTS = ["the ocean", "a violin", "bread", "Mars", "a lighthouse", "chess", "winter", "a river",
            "volcanoes", "the printing press", "honeybees", "a library", "glaciers", "jazz", "the moon", "trains"]
PROMPTS = [f"Write two sentences about {s}." for s in SUBJECTS]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def texts(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def batched(llm) -> list[list[int]]:
    return texts(llm.generate(PROMPTS, GREEDY))


def test_batched_equals_alone(llm, batched) -> None:
    alone = [texts(llm.generate([p], GREEDY))[0] for p in PROMPTS]
    assert batched == alone


def test_prefix_cache_on_equals_off(llm) -> None:
    system = ("You are a meticulous assistant. Answer briefly, cite nothing, and never apologise. " * 4)
    prompts = [system + f"Question: what is notable about {s}?" for s in SUBJECTS[:6]]
    off = LLM(progress=False, kv_cache_memory=64 * 2**20, max_model_len=1024, enable_prefix_caching=False,
              dtype="float32", quantization="dequantize")
    want = texts(off.generate(prompts, GREEDY))
    bm = llm.engine.block_manager
    hits_before = bm.num_hits
    first = texts(llm.generate(prompts, GREEDY))
    second = texts(llm.generate(prompts, GREEDY))  # now served mostly from the cache
    assert first == want and second == want
    assert bm.num_hits > hits_before


def test_preempted_equals_ample(batched) -> None:
    # 10 blocks of 16 tokens: far less than 16 requests need at once, so requests are preempted
    small = LLM(progress=False, kv_cache_memory=10 * 16 * 46080, max_model_len=160, dtype="float32", quantization="dequantize")
    assert small.engine.plan.num_blocks == 10
    got = texts(small.generate(PROMPTS, GREEDY))
    assert small.engine.scheduler.num_preemptions > 0
    assert got == batched
    assert small.engine.block_manager.num_free_blocks == 10


def test_chunked_prefill_equals_whole(batched) -> None:
    chunked = LLM(progress=False, kv_cache_memory=64 * 2**20, max_model_len=1024, max_num_batched_tokens=16,
                  dtype="float32", quantization="dequantize")
    assert texts(chunked.generate(PROMPTS, GREEDY)) == batched


def test_n4_seeded_is_reproducible(llm) -> None:
    p = SamplingParams(n=4, temperature=0.9, top_p=0.95, seed=1234, max_tokens=20)
    a = llm.generate(["Tell me a story about a cat."], p)[0]
    b = llm.generate(["Tell me a story about a cat."], p)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1, "the n sequences should differ"
    # and the same seed gives the same text whatever else is in the batch
    c = llm.generate(["Tell me a story about a cat.", "Unrelated prompt"], [p, SamplingParams(temperature=1.0, max_tokens=20)])[0]
    assert [o.token_ids for o in c.outputs] == [o.token_ids for o in a.outputs]
