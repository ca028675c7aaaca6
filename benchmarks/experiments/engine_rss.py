"""The offline engine's RSS on the default model after load and after 16 requests (200 random tokens in, 64
out), the KV cache (2 GiB by default) included: run it with and without TOKENMILL_VNNI_PACK=0 to see what
the packed blocks cost.

    .venv/bin/python benchmarks/experiments/engine_rss.py; TOKENMILL_VNNI_PACK=0 .venv/bin/python benchmarks/experiments/engine_rss.py
"""
import json
import os
import random

from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams


def rss_mib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


eng = LLMEngine(EngineConfig(model="default", max_model_len=2048), progress=False)
idle = rss_mib()
rng = random.Random(0)
for i in range(16):
    eng.add_request(f"r{i}", [rng.randrange(100, 40000) for _ in range(200)],
                    SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
while eng.has_unfinished_requests():
    eng.step()
print(json.dumps({"idle_mib": idle, "after_16_mib": rss_mib(), "TOKENMILL_VNNI_PACK": os.environ.get("TOKENMILL_VNNI_PACK")}))
