"""The default model's greedy answer (128 tokens) to the grounded code-edit prompt of `tokenmill bench spec`, at the
default settings (TAG env: a label): which text the n-gram drafts meet on each big-batch path.

    TOKENMILL_VNNI_MATMUL=1 TAG=vnni-panel .venv/bin/python benchmarks/experiments/grounded_text.py
    TOKENMILL_VNNI_MATMUL=0 TAG=bf16-copy .venv/bin/python benchmarks/experiments/grounded_text.py
"""
import json, os
from tokenmill import LLM
from tokenmill.sampling_params import SamplingParams
from tokenmill.benchmarks.spec import GROUNDED
convs = json.loads(GROUNDED.read_text())
llm = LLM(progress=False)
ids = llm.engine.input_processor.render_chat_ids(convs["code_edit"], True)
o = llm.generate([ids], SamplingParams(temperature=0, max_tokens=128), use_tqdm=False)[0].outputs[0]
print(os.environ.get("TAG"), repr(llm.tokenizer.decode(o.token_ids)))
