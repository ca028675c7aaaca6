"""Where a speculative (n-gram) one-stream step's time goes, by its row count: the default model at --dtype auto,
one grounded prompt (benchmarks/prompts/spec_grounded.json; argv[1], default summarise_quotes), 128 greedy
tokens, 3 warm runs then 3 timed; per row count the median step, execute_model, input preparation, forward
(the native decode step), head (compute_logits) and sampling, ms. AMXMIN=n sets block_matmul.AMX_MIN_ROWS
for the run (the crossover from the integer block kernel to the AMX one).

    [AMXMIN=4] .venv/bin/python benchmarks/experiments/spec_step_rows.py [summarise_quotes|code_edit]
"""
import collections, json, sys, time
import torch
from tokenmill.entrypoints.llm import LLM
from tokenmill.config import SpeculativeConfig
from tokenmill.sampling_params import SamplingParams
import tokenmill.worker.model_runner as mr
T = collections.defaultdict(list)
cur = {}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        s = time.perf_counter(); r = f(*a, **k); cur[key] = cur.get(key, 0) + time.perf_counter() - s; return r
    setattr(obj, name, g)
import os, tokenmill.native.block_matmul as _bm
if os.environ.get("AMXMIN"): _bm.AMX_MIN_ROWS = int(os.environ["AMXMIN"])
llm = LLM(model="default", progress=False, speculative_config=SpeculativeConfig.parse('{"method":"ngram"}'))
eng = llm.engine
import gc
runner = next(o for o in gc.get_objects() if isinstance(o, mr.ModelRunner))
model = runner.model
wrap(model, "forward", "forward"); wrap(model, "compute_logits", "head"); wrap(mr, "sample", "sample")
wrap(runner, "_prepare_inputs", "prep")
wrap(runner, "execute_model", "exec")
stepf = eng.step
rows_of = {}
def step():
    cur.clear(); s = time.perf_counter(); r = stepf(); tot = time.perf_counter() - s
    n = int(runner_last[0]) if runner_last else 0
    T[n].append(dict(cur, step=tot))
    return r
runner_last = []
fw = model.forward
def fw2(input_ids, *a, **k):
    runner_last[:] = [input_ids.shape[0]]; return fw(input_ids, *a, **k)
model.forward = fw2
eng.step = step
convs = json.load(open("benchmarks/prompts/spec_grounded.json"))
ids = eng.input_processor.render_chat_ids(convs[sys.argv[1] if len(sys.argv) > 1 else "summarise_quotes"], True)
p = SamplingParams(temperature=0, max_tokens=128)
for _ in range(3): llm.generate([ids], p, use_tqdm=False)
T.clear()
for _ in range(3): llm.generate([ids], p, use_tqdm=False)
for n in sorted(T):
    if n > 16: continue
    v = T[n]; keys = v[0].keys()
    print(f"rows {n}: {len(v)} steps; " + ", ".join(f"{k} {1e3*sorted(x.get(k,0) for x in v)[len(v)//2]:.2f}" for k in ("step","exec","prep","forward","head","sample")))
