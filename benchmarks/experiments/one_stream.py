"""One stream's decode step, engine alone: a 200-token random prompt -> 300 greedy tokens on the default model
at --dtype auto; prints the p10 / p50 / p90 wall time of the decode steps (after one warm-up request).

    .venv/bin/python benchmarks/experiments/one_stream.py
"""

from __future__ import annotations

import random
import time

from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams

eng = LLMEngine(EngineConfig(model="default"), progress=False)
rng = random.Random(0)


def run(n_out: int, tag: str) -> list[float]:
    eng.add_request(tag, [rng.randrange(100, 40000) for _ in range(200)],
                    SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True))
    eng.step()  # the prompt
    ts = []
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        eng.step()
        ts.append(time.perf_counter() - t)
    return ts


run(32, "warm")
ts = sorted(run(300, "timed"))
p = lambda q: ts[int(q * (len(ts) - 1))] * 1e3  # noqa: E731
print(f"one-stream decode step ms: p10 {p(0.1):.2f}, p50 {p(0.5):.2f}, p90 {p(0.9):.2f} ({len(ts)} steps)")
