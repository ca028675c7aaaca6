"""The output head at 2 / 7 / 16 rows, bf16, on its kernels (block below AMX_MIN_ROWS, AMX fp32 entry from it) against
the dense bf16 copy (oneDNN), 64 MB swept through the caches before each call as a step's layers do; medians
of 30, ms. For _HEAD_ROWS in layers/ggml_linear.py.

    .venv/bin/python benchmarks/experiments/head_rows_kernel_vs_dense.py
"""
import os, time, statistics, torch
os.environ["TOKENMILL_GGML_MAX_ROWS"] = "1"
import tokenmill.layers.ggml_linear as gl
from tokenmill.entrypoints.llm import LLM
llm = LLM(model="default", progress=False)
model = llm.engine.executor.worker.model
head = model.lm_head
big = torch.randn(64 << 20 >> 2)  # 64 MB to sweep the caches between calls, as a step's layers do
for m in (2, 7, 16):
    h = torch.randn(m, head.in_features).to(torch.bfloat16)
    T = {"kernel": [], "dense": []}
    for i in range(30):
        for tag in ("kernel", "dense"):
            big.add_(1.0)
            s = time.perf_counter()
            y = head.method._ggml(head, h) if tag == "kernel" else head.method._dense(head, h)
            T[tag].append(time.perf_counter() - s)
    print(m, {k: round(statistics.median(v) * 1e3, 2) for k, v in T.items()})
