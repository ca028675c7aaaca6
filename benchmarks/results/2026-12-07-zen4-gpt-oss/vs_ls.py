import json, sys, urllib.request
sys.path.insert(0, "tests/model"); sys.path.insert(0, "tests")
from tokenmill import LLM, SamplingParams
path, port = sys.argv[1], sys.argv[2]
kw = dict(progress=False, kv_cache_memory=16 * 2**20, max_model_len=256, dtype="float32")
if len(sys.argv) > 3: kw["quantization"] = sys.argv[3]
llm = LLM(path, **kw)
prompts = ["Hello there, how are you doing today?", "def f(x):\n    return x * 2\n" * 3,
           "The quick brown fox jumps over the lazy dog.", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
           "Once upon a time", "import numpy as np\n", "Paris is the capital of", "a b c d e f g h i j k l m n o p",
           "What is 2+2?", "The weather today is", "SELECT * FROM users WHERE", "<html><body>"]
same = tot_tok = same_tok = 0
for p in prompts:
    ids = llm.tokenizer.encode(p)
    ours = llm.generate([ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0].outputs[0].token_ids
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps({"prompt": ids, "n_predict": 32, "temperature": 0, "top_k": 1, "cache_prompt": False, "ignore_eos": True, "return_tokens": True}).encode(), headers={"Content-Type": "application/json"})
    theirs = json.loads(urllib.request.urlopen(req).read())["tokens"]
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    same += ours == theirs; same_tok += k; tot_tok += 32
    print(len(ids), "identical" if ours == theirs else f"first differs at {k}")
print(f"identical {same}/{len(prompts)}, common prefix {same_tok}/{tot_tok} tokens")
