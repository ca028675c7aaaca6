"""A/B experiment (not part of tokenmill): torch.compile the per-layer elementwise glue of the decoder.

    .venv/bin/python benchmarks/experiments/compile_glue.py eager
    .venv/bin/python benchmarks/experiments/compile_glue.py compiled

Patches DecoderLayer.forward (same math; residual add + RMSNorm, RoPE and silu * up go through three
functions that are compiled with dynamic=True in "compiled" mode) and prints compile time, one-request
TTFT / decode tok/s, offline tok/s (64 x 200 -> 128) and a batch-64 decode step. Result 2026-11-30: slower
in every figure (benchmarks/README.md), so not adopted.
"""
import sys, time, torch
import torch.nn.functional as F
import tokenmill.models.llama as M
from tokenmill.layers.linear import linear
from tokenmill.layers.attention import write_kv, paged_attention
MODE = sys.argv[1]

def _add_norm(x, o, w, eps: float):
    x = x + o
    return x, F.rms_norm(x, (x.shape[-1],), w, eps)
def _silu_mul(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u
def _rot(qk, cos, ssin):
    return qk * cos + qk.roll(qk.shape[-1] // 2, dims=-1) * ssin
if MODE == "compiled":
    add_norm = torch.compile(_add_norm, dynamic=True)
    silu_mul = torch.compile(_silu_mul, dynamic=True)
    rot = torch.compile(_rot, dynamic=True)
else:
    add_norm, silu_mul, rot = _add_norm, _silu_mul, _rot

def forward(self, x, rope, kv_cache, meta, h=None):
    T = x.shape[0]
    if h is None:
        h = self.input_norm(x)
    sc, pk = self.scales, self.packed
    qkv = linear(h, self.qkv_weight, sc["qkv"], self.qkv_bias, pk["qkv"])
    qk, v = qkv.split([(self.nh + self.nkv) * self.hd, self.nkv * self.hd], dim=-1)
    qk = rot(qk.reshape(T, self.nh + self.nkv, self.hd), rope[0], rope[1])
    q, k = qk[:, : self.nh], qk[:, self.nh :]
    v = v.reshape(T, self.nkv, self.hd)
    write_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)
    attn = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.layer_idx)
    o = linear(attn.reshape(T, -1), self.o_weight, sc["o"], packed=pk["o"])
    x, h = add_norm(x, o, self.post_attn_norm.weight, self.post_attn_norm.eps)
    return x + linear(silu_mul(linear(h, self.gate_up_weight, sc["gate_up"], packed=pk["gate_up"])), self.down_weight, sc["down"], packed=pk["down"])
M.DecoderLayer.forward = forward

from tokenmill import LLM, SamplingParams
from tokenmill.benchmarks.throughput import random_prompts, run_throughput, run_latency
llm = LLM(progress=False, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=2048)
t = time.perf_counter()
run_latency(llm, 50, 4, 1)
llm.generate(random_prompts(llm, 8, 30, 5), SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
print(MODE, "warm-up (compile) s", round(time.perf_counter() - t, 1))
r = run_latency(llm, 200, 64, 0); print(MODE, "ttft", round(r["ttft_s"], 4), "decode tok/s", round(r["decode_tok_per_s"], 1))
print(MODE, "offline", round(run_throughput(llm, 64, 200, 128, 0)["output_tok_per_s"], 1))
eng = llm.engine
ps = random_prompts(llm, 64, 200, 9)
for i, p in enumerate(ps): eng.add_request(f"z{i}", p, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
for _ in range(35): eng.step()
t = time.perf_counter()
for _ in range(10): eng.step()
print(MODE, "decode step batch 64 ms", round((time.perf_counter() - t) / 10 * 1e3, 1))
