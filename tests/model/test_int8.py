"""Opt-in int8 weight-only mode (CPU): close to fp32, and still batch-invariant within the mode."""

from __future__ import annotations

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.config import EngineConfig
from tokenmill.platforms import cpu_bf16_is_fast

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at",
           "The largest planet in the solar system is", "import numpy as np\n"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=["float32", pytest.param(
    "bfloat16", marks=pytest.mark.skipif(not cpu_bf16_is_fast(), reason="bf16 is slow without AMX or AVX512_BF16"))])
def int8_llm(request) -> LLM:
    """int8 weights under both compute dtypes (the int8 kernel itself always takes bf16 activations)."""
    return LLM(progress=False, kv_cache_memory=64 * 2**20, max_model_len=512, quantization="int8",
               dtype=request.param)


def test_int8_batched_equals_alone(int8_llm: LLM) -> None:
    batched = [o.outputs[0].token_ids for o in int8_llm.generate(PROMPTS, GREEDY)]
    alone = [int8_llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    assert batched == alone


def test_int8_stays_close_to_fp32(int8_llm: LLM, llm: LLM) -> None:
    ref = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    got = [o.outputs[0].token_ids for o in int8_llm.generate(PROMPTS, GREEDY)]
    same_first_4 = sum(r[:4] == g[:4] for r, g in zip(ref, got))
    assert same_first_4 >= len(PROMPTS) - 1, (ref, got)


def test_int8_is_refused_where_it_cannot_work() -> None:
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int4")
