"""Teacher-forced agreement with the fp32 dequantized reference (the `dequantize` engine), 2,000 tokens of the
repo's README and scheduler source in 250-token prompts, for the default model at bf16 on each big-batch path:
the dense bf16 copy (oneDNN), the 8-bit and 16-bit VNNI panel kernels, the fp32 panel kernel (bf16 rows in),
the 16-bit block kernel, and at fp32 on the fp32 panel kernel (at fp32 the method never takes the VNNI one). Every prompt
row takes the path (TOKENMILL_GGML_MAX_ROWS / TOKENMILL_PANEL_MIN_ROWS fix the choice).

    .venv/bin/python benchmarks/experiments/vnni_agreement.py
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = {  # name -> (env, engine kwargs)
    "bf16, dense copy": ({"TOKENMILL_GGML_MAX_ROWS": "1", "TOKENMILL_VNNI_MATMUL": "0"}, "dtype='bfloat16', dense_copy='on'"),
    "bf16, 8-bit VNNI panel": ({"TOKENMILL_PANEL_MIN_ROWS": "1", "TOKENMILL_GGML_MAX_ROWS": "1000000", "TOKENMILL_VNNI_MATMUL": "1"}, "dtype='bfloat16', dense_copy='off'"),
    "bf16, 16-bit VNNI panel": ({"TOKENMILL_PANEL_MIN_ROWS": "1", "TOKENMILL_GGML_MAX_ROWS": "1000000"}, "dtype='bfloat16', dense_copy='off'"),
    "bf16, fp32 panel": ({"TOKENMILL_PANEL_MIN_ROWS": "1", "TOKENMILL_GGML_MAX_ROWS": "1000000", "TOKENMILL_VNNI_MATMUL": "0"}, "dtype='bfloat16', dense_copy='off'"),
    "bf16, 16-bit block kernel": ({"TOKENMILL_PANEL_MATMUL": "0", "TOKENMILL_GGML_MAX_ROWS": "1000000"}, "dtype='bfloat16', dense_copy='off'"),
    "fp32, fp32 panel": ({"TOKENMILL_PANEL_MIN_ROWS": "1", "TOKENMILL_GGML_MAX_ROWS": "1000000", "TOKENMILL_VNNI_MATMUL": "0"}, "dtype='float32', dense_copy='off'"),
}
CHILD = r'''
import sys, torch
sys.path.insert(0, "tests/model")
from raw_forward import prompt_logits
from tokenmill import LLM
ref = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32", quantization="dequantize")
ours = LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, %s)
text = open("README.md").read() + open("tokenmill/engine/scheduler.py").read()
ids = ref.tokenizer.encode(text)
agree = total = 0
meds = []
for i in range(0, 2000, 250):
    p = ids[i:i + 250]
    a, b = prompt_logits(ref, p), prompt_logits(ours, p).float()
    meds.append(float(((a - b).norm(dim=-1) / a.norm(dim=-1)).median()))
    agree += int((a.argmax(-1) == b.argmax(-1)).sum()); total += len(p)
print(f"top-1 {agree / total:.4f} ({agree}/{total}), median relative logit error {sorted(meds)[len(meds)//2]:.2e}")
'''
if __name__ == "__main__":
  for name, (env, kw) in CASES.items():
      out = subprocess.run([sys.executable, "-c", CHILD % kw], cwd=ROOT, env=os.environ | env, capture_output=True, text=True)
      print(f"{name}: {out.stdout.strip() or out.stderr[-500:]}", flush=True)
