import sys, time
from tokenmill.config import EngineConfig
from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.sampling_params import SamplingParams
eng = LLMEngine(EngineConfig(model="default"), progress=False)
meds = []
for r in range(3):
    eng.add_request(f"r{r}", [100 + r + i for i in range(30)], SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True))
    ts = []
    while eng.has_unfinished_requests():
        s = time.perf_counter(); eng.step(); ts.append(time.perf_counter() - s)
    ts = sorted(ts[2:]); meds.append(1e3 * ts[len(ts) // 2])
print(sys.argv[1], "median decode step ms per run:", " ".join("%.3f" % m for m in meds), flush=True)
