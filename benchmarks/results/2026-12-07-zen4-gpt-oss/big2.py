import time, resource, sys, os
from tokenmill import LLM, SamplingParams
def rss():
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"): d[k] = f"{int(v.split()[0])/2**20:.2f}"
    return d
llm = LLM(os.path.expanduser("~/.cache/tokenmill/big/gpt-oss-20b-shape-MXFP4_MOE.gguf"), progress=False, max_model_len=4096, kv_cache_memory=2**30)
print("after load", rss(), "plan", llm.engine.plan.weight_bytes/2**30, flush=True)
ids = list(range(1000, 1128))
out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
print("after gen", rss(), out[0].outputs[0].token_ids[:20], flush=True)
m = llm.engine.executor.worker.model
import collections, torch
c = collections.Counter()
for name, mod in m.named_modules():
    for pn, p in mod.named_parameters(recurse=False):
        c[type(mod).__name__ + "." + pn] += p.numel() * p.element_size()
    for bn, b in mod.named_buffers(recurse=False):
        c[type(mod).__name__ + ".buf." + bn] += b.numel() * b.element_size()
for k, v in c.most_common(12): print(k, f"{v/2**20:.1f} MiB")
