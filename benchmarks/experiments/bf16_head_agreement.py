"""Teacher-forced greedy agreement of the default model at bf16 with fp32, and the exact top-2 ties in its
bf16 logits: 8 chunks of 256 tokens of README.md, every position's argmax, all matmuls on the blocks
(TOKENMILL_GGML_MAX_ROWS fixed, so the head runs on the block / AMX kernels, not oneDNN's dense copy).

    .venv/bin/python benchmarks/experiments/bf16_head_agreement.py
"""

from __future__ import annotations

import os
import sys

os.environ["TOKENMILL_GGML_MAX_ROWS"] = str(10**6)
sys.path.insert(0, "tests/model")
from raw_forward import prompt_logits  # noqa: E402

from tokenmill import LLM  # noqa: E402

ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=512, dtype="float32")
bf = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=512, dtype="bfloat16")
ids = ref.tokenizer.encode(open("README.md").read()[:20000])
n = agree = ties = 0
for s in range(0, 8 * 256, 256):
    a, b = prompt_logits(ref, ids[s:s + 256]), prompt_logits(bf, ids[s:s + 256])
    agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    n += a.shape[0]
    top2 = b.float().topk(2, -1).values
    ties += int((top2[:, 0] == top2[:, 1]).sum())
print(f"bf16 vs fp32 teacher-forced top-1 agreement {agree}/{n} = {agree / n:.4f}; "
      f"exact top-2 ties in the bf16 logits: {ties}")
