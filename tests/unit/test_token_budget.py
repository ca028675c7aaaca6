"""The step's token budget when --max-num-batched-tokens is not given: 2048 where big batches run on oneDNN's
bf16 matmuls on a CPU with AMX (there it measured up to 1.2x the throughput at C=64), 512 elsewhere; the flag
always wins."""

from __future__ import annotations

import logging

import pytest

from tokenmill.compute import AMX_TOKEN_BUDGET, TOKEN_BUDGET, ComputeChoice, default_token_budget
from tokenmill.config import EngineConfig


GGUF_COPY = dict(linear_method="gguf", dense_copy=True)  # a small GGUF file: blocks and a dense bf16 copy


@pytest.mark.parametrize(("device", "dtype", "method", "amx", "want"), [
    ("cpu", "bfloat16", GGUF_COPY, True, AMX_TOKEN_BUDGET),
    ("cpu", "bfloat16", dict(linear_method="prepacked"), True, AMX_TOKEN_BUDGET),  # an HF checkpoint at bf16
    ("cpu", "bfloat16", dict(linear_method="gguf"), True, TOKEN_BUDGET),  # blocks alone (a 7B file): unmeasured
    ("cpu", "float32", GGUF_COPY, True, TOKEN_BUDGET),  # --dtype float32 on AMX: fp32 matmuls, as on AVX2 hosts
    ("cpu", "bfloat16", GGUF_COPY, False, TOKEN_BUDGET),  # AVX512_BF16 without AMX (Zen 4): 1024 gained nothing served
    ("cpu", "float32", dict(linear_method="gguf"), False, TOKEN_BUDGET),
    ("cuda", "bfloat16", dict(linear_method="unquantized"), True, TOKEN_BUDGET),
])
def test_the_default_budget_follows_the_compute(device: str, dtype: str, method: dict, amx: bool, want: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenmill.cpu_features as cf

    flags = {"avx2", "avx512f", "avx512_bf16"} | ({"amx_tile", "amx_bf16"} if amx else set())
    monkeypatch.setattr(cf, "cpu_flags", lambda: frozenset(flags))
    assert default_token_budget(device, ComputeChoice(dtype, **method)) == want
    assert TOKEN_BUDGET == 512 and AMX_TOKEN_BUDGET == 2048


def test_the_config_takes_none_and_refuses_zero() -> None:
    assert EngineConfig().max_num_batched_tokens is None
    with pytest.raises(ValueError, match="max_num_batched_tokens must be at least 1"):
        EngineConfig(max_num_batched_tokens=0)


def test_the_engine_schedules_the_rule_s_budget_or_the_flag(caplog: pytest.LogCaptureFixture) -> None:
    from tokenmill import LLM
    from tokenmill.sampling_params import SamplingParams

    common = dict(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256)
    with caplog.at_level(logging.INFO, logger="tokenmill"):
        engine = LLM(**common).engine
    want = default_token_budget(engine.platform.device.type, engine.platform.compute)
    assert engine.scheduler.config.max_num_batched_tokens == want == engine.max_num_batched_tokens
    assert f"scheduler: up to {want} tokens and 64 sequences a step" in caplog.text

    flagged = LLM(**common, max_num_batched_tokens=48)
    sched = flagged.engine.scheduler
    assert sched.config.max_num_batched_tokens == 48
    sizes: list[int] = []
    schedule = sched.schedule

    def spy():  # type: ignore[no-untyped-def]
        out = schedule()
        sizes.append(out.total_num_scheduled_tokens)
        return out

    sched.schedule = spy  # type: ignore[method-assign]
    # a 200-token prompt is prefilled in chunks of the budget: 48, 48, 48, 48, 8
    flagged.generate([{"prompt_token_ids": list(range(1, 201))}], SamplingParams(max_tokens=1, temperature=0))
    assert [s for s in sizes if s] == [48, 48, 48, 48, 8], sizes
