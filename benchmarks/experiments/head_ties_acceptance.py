"""n-gram acceptance with the head's fp32 logits (as shipped) against the same engine with the head's logits
rounded to bf16 (lm_head.wide_out = False, as before 2026-12-05 evening), the grounded prompts, 128 greedy
tokens, 3 runs each: the share of drafted tokens accepted and the start of the answer.

    .venv/bin/python benchmarks/experiments/head_ties_acceptance.py
"""
import json, time, statistics, gc
from tokenmill.entrypoints.llm import LLM
from tokenmill.config import SpeculativeConfig
from tokenmill.sampling_params import SamplingParams
llms = {}
for tag in ("fp32-head", "bf16-head"):
    llms[tag] = LLM(model="default", progress=False, speculative_config=SpeculativeConfig.parse('{"method":"ngram"}'))
    if tag == "bf16-head": llms[tag].engine.executor.worker.model.lm_head.wide_out = False
convs = json.load(open("benchmarks/prompts/spec_grounded.json"))
p = SamplingParams(temperature=0, max_tokens=128)
for name in convs:
    ids = llms["fp32-head"].engine.input_processor.render_chat_ids(convs[name], True)
    for tag, l in llms.items():
        l.generate([ids], p, use_tqdm=False)
        s = l.engine.spec; d0, a0 = s.num_draft_tokens, s.num_accepted_tokens
        o = None
        for _ in range(3): o = l.generate([ids], p, use_tqdm=False)[0]
        print(name, tag, "accepted %.2f" % ((s.num_accepted_tokens - a0) / max(1, s.num_draft_tokens - d0)), repr(o.outputs[0].text[:80]))
