"""The step's token budget when --max-num-batched-tokens is not given: 2048 at bf16 on a CPU with AMX (where it
measured up to 1.2x the throughput at C=64), 512 elsewhere; the flag always wins."""

from __future__ import annotations

import logging

import pytest

from tokenmill.compute import AMX_TOKEN_BUDGET, TOKEN_BUDGET, ComputeChoice, default_token_budget
from tokenmill.config import EngineConfig


@pytest.mark.parametrize(("device", "dtype", "amx", "want"), [
    ("cpu", "bfloat16", True, AMX_TOKEN_BUDGET),
    ("cpu", "float32", True, TOKEN_BUDGET),  # --dtype float32 on an AMX CPU: the fp32 matmuls of AVX2 hosts
    ("cpu", "bfloat16", False, TOKEN_BUDGET),  # AVX512_BF16 without AMX (Zen 4): not measured, unchanged
    ("cpu", "float32", False, TOKEN_BUDGET),
    ("cuda", "bfloat16", True, TOKEN_BUDGET),
])
def test_the_default_budget_follows_the_compute(device: str, dtype: str, amx: bool, want: int) -> None:
    assert default_token_budget(device, ComputeChoice(dtype, "gguf"), amx=amx) == want
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
