"""n-gram speculation's draft lengths side by side: three engines in one process (off, draft_length "fixed" =
always 6, "adaptive" = the default rule), the grounded prompts at one stream, 128 greedy tokens, 4 rounds in
alternating order; median tok/s, the speed-up over off, and the tokens a step (1 + accepted drafts).

    .venv/bin/python benchmarks/experiments/draft_length_ab.py [off,fixed,adaptive]
"""
import json, sys, time, statistics
from tokenmill.entrypoints.llm import LLM
from tokenmill.config import SpeculativeConfig
from tokenmill.sampling_params import SamplingParams
def mk(mode):
    kw = {} if mode == "off" else {"speculative_config": SpeculativeConfig.parse(json.dumps({"method": "ngram", "draft_length": mode}))}
    return LLM(model="default", progress=False, **kw)
modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["off", "fixed", "adaptive"]
llms = {m: mk(m) for m in modes}
eng = llms["off"].engine
convs = json.load(open("benchmarks/prompts/spec_grounded.json"))
p = SamplingParams(temperature=0, max_tokens=128)
for name in convs:
    ids = eng.input_processor.render_chat_ids(convs[name], True)
    for l in llms.values(): l.generate([ids], p, use_tqdm=False)
    T = {m: [] for m in modes}; acc = {m: 0 for m in modes}
    for r in range(4):
        order = modes if r % 2 == 0 else modes[::-1]
        for m in order:
            s = llms[m].engine.spec; a0 = s.num_accepted_tokens if s else 0
            t = time.perf_counter(); o = llms[m].generate([ids], p, use_tqdm=False); T[m].append(time.perf_counter() - t)
            acc[m] += (s.num_accepted_tokens - a0) if s else 0
    base = statistics.median(T["off"])
    print(name, "  ".join(f"{m} {128/statistics.median(T[m]):.1f} tok/s ({base/statistics.median(T[m]):.2f}x, {4*128/(4*128-acc[m]):.2f} tok/step)" for m in modes), flush=True)
