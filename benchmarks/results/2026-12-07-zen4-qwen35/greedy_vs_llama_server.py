import sys, json, urllib.request
sys.path.insert(0, "/work/main/tests/model")
import test_qwen3_5 as T
from tokenmill import LLM, SamplingParams
llm = LLM("/tmp/q35chk/conv.gguf", **T.ENGINE)
prompts = T.PROMPTS + ["Once upon a time", "import numpy as np\nx = np.", "The capital of France is", "a b c d e f g"]
ids = [llm.tokenizer.encode(p) for p in prompts]
ours = [o.outputs[0].token_ids for o in llm.generate(ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))]
same = 0; first = []
for i, o in zip(ids, ours):
    req = json.dumps({"prompt": i, "n_predict": 32, "temperature": 0, "top_k": 1, "return_tokens": True, "ignore_eos": True, "cache_prompt": False}).encode()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8093/completion", req, {"Content-Type": "application/json"})))
    t = r["tokens"]
    same += t == o
    k = next((j for j, (x, y) in enumerate(zip(t, o)) if x != y), min(len(t), len(o)))
    first.append(k)
print(f"identical {same}/{len(ids)}; tokens before the first difference {first}")
