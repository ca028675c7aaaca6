"""How far n-gram drafts can go on a grounded prompt, whatever a verification row costs: the default model's greedy
answer (128 tokens) to one prompt of benchmarks/prompts/spec_grounded.json (argv[1], default summarise_quotes),
then a walk along it as greedy speculation with drafts of 6 would take it: each step proposes from the
tokens so far (prompt lookup, MIN_N..5 tokens), keeps the drafts that match the answer, adds the next
token. Prints the steps (so the tokens a step: the speed-up if a verification step cost one plain step),
the steps that had no match, and the drafts rejected at their first token (REJ lines with DEBUG=1).

    MIN_N=2 .venv/bin/python benchmarks/experiments/draft_ceiling.py [summarise_quotes|code_edit]
"""
import json
from tokenmill.entrypoints.llm import LLM
from tokenmill.config import SpeculativeConfig
from tokenmill.sampling_params import SamplingParams
from tokenmill.engine import ngram_proposer as npm
llm = LLM(model="default", progress=False)
eng = llm.engine
tok = eng.input_processor
convs = json.load(open("benchmarks/prompts/spec_grounded.json"))
ids = eng.input_processor.render_chat_ids(convs[__import__("sys").argv[1] if len(__import__("sys").argv) > 1 else "summarise_quotes"], True)
o = llm.generate([ids], SamplingParams(temperature=0, max_tokens=128), use_tqdm=False)[0]
out = list(o.outputs[0].token_ids)
print(repr(o.outputs[0].text))
# simulate greedy drafts of length 6 along the actual output: per position, what would be proposed and accepted
from tokenmill.engine.ngram_proposer import propose
import os; MIN_N = int(os.environ.get("MIN_N", "2"))
dec = lambda t: llm.engine.input_processor.tokenizer.decode(t) if hasattr(llm.engine.input_processor, "tokenizer") else str(t)
seq = list(ids); i = 0; steps = 0; tot_acc = 0; nodraft = 0; zero = 0
while i < len(out):
    text = "".join(map(chr, seq))
    d = propose(text, 6, MIN_N, 5)
    a = 0
    while a < len(d) and i + a < len(out) and d[a] == out[i + a]: a += 1
    if not d: nodraft += 1
    elif a == 0:
        zero += 1
        if os.environ.get("DEBUG"): print("REJ at", i, "ctx", repr(dec(seq[-6:])), "draft", repr(dec(d)), "actual", repr(dec(out[i:i+6])))
    take = a + 1
    seq += out[i:i + take]; i += take; steps += 1; tot_acc += a
print("steps", steps, "tokens", len(out), "accepted", tot_acc, "no-draft steps", nodraft, "all-rejected", zero)
