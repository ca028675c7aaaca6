"""llama.cpp-converted tiny random Granite 4.0-H (moe, dense) and LFM2-MoE against transformers (prompt logits)
and llama-server (32 greedy tokens). Usage: greedy.py DIR NAME PORT  (DIR/NAME/hf from make_hf.py, DIR/NAME/conv.gguf
from llama.cpp's convert_hf_to_gguf.py --outtype f32; llama-server already serving conv.gguf on PORT)."""
import json
import sys
import urllib.request

import torch
import transformers

sys.path.insert(0, "/work/main/tests/model")
from raw_forward import prompt_logits, ref_logits  # noqa: E402
import test_granite_hybrid as G  # noqa: E402

from tokenmill import LLM, SamplingParams  # noqa: E402

root, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
hf = transformers.AutoModelForCausalLM.from_pretrained(f"{root}/{name}/hf", dtype=torch.float32).eval()
llm = LLM(f"{root}/{name}/conv.gguf", **G.ENGINE)
prompts = G.PROMPTS + ["Once upon a time", "import numpy as np\nx = np.", "The capital of France is", "a b c d e f g",
                       "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "SELECT * FROM",
                       "Dear Sir or Madam,", "for (int i = 0; i < n; ++i) {"]
ids = [llm.tokenizer.encode(p) for p in prompts]
worst = 0.0
for i in ids:
    d = (prompt_logits(llm, i) - ref_logits(hf, i)).abs().max().item()
    worst = max(worst, d)
print(f"{name}: prompt logits vs transformers: max |diff| {worst:.2e} over {len(ids)} prompts "
      f"({'ok' if worst < 1e-3 else 'FAIL'} at 1e-3)")
ours = [o.outputs[0].token_ids for o in llm.generate(ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))]
same = 0
first = []
for i, o in zip(ids, ours):
    req = json.dumps({"prompt": i, "n_predict": 32, "temperature": 0, "top_k": 1, "return_tokens": True,
                      "ignore_eos": True, "cache_prompt": False}).encode()
    r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", req,
                                                                {"Content-Type": "application/json"})))
    t = r["tokens"]
    same += t == o
    first.append(next((j for j, (x, y) in enumerate(zip(t, o)) if x != y), min(len(t), len(o))))
print(f"{name}: greedy vs llama-server: identical {same}/{len(ids)}; tokens before the first difference {first}")
