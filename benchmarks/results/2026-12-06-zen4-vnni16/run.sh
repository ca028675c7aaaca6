#!/usr/bin/env bash
# The commands behind benchmarks/results/2026-12-06-zen4-vnni16/ (issues 10 and 15 on the Zen 4 kind, 2026-12-06
# afternoon), in order.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-06-zen4-vnni16
lscpu > $R/lscpu.txt
# the kernels' arithmetic against the fp32 reference, and against the bf16 copy / each other
.venv/bin/python benchmarks/experiments/vnni_agreement.py > $R/agreement.txt
.venv/bin/python benchmarks/experiments/vnni_vs_bf16.py > $R/vnni_vs_bf16.txt
# at ae853b9 (16-bit panel, packed blocks, no direct path yet): the sweep
PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/before-direct benchmarks/compare.sh
# the final code (d5251ee: a few rows straight from the packed bytes)
PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/final benchmarks/compare.sh
# decode-only steps and one stream, each lever on and off (offline)
.venv/bin/python benchmarks/experiments/decode_step_rows.py 1 A=1 TOKENMILL_VNNI_PACK=0 TOKENMILL_VNNI_MATMUL=0 > $R/decode_step_rows.txt
.venv/bin/python benchmarks/experiments/decode_step_rows.py 16 A=1 TOKENMILL_VNNI_PACK=0 TOKENMILL_VNNI_MATMUL=0 >> $R/decode_step_rows.txt
.venv/bin/python benchmarks/experiments/decode_step_rows.py 64 A=1 TOKENMILL_VNNI_PACK=0 >> $R/decode_step_rows.txt
# issue 15 on this kind at the final code
bash benchmarks/spec_grounded.sh $R/spec
# a second round at the final code, C=16 / C=64 against vLLM bf16 only (C=64 had moved between the rounds above)
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/final-round2 benchmarks/compare.sh
# memory: RSS after load and after 16 requests, packed and plain (the 2 GiB KV cache included)
.venv/bin/python benchmarks/experiments/engine_rss.py > $R/rss.txt
TOKENMILL_VNNI_PACK=0 .venv/bin/python benchmarks/experiments/engine_rss.py >> $R/rss.txt
