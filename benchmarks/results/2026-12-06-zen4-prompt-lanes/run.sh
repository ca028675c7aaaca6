#!/usr/bin/env bash
# The commands behind benchmarks/results/2026-12-06-zen4-prompt-lanes/ (issues 10 and 15 on the Zen 4 kind,
# 2026-12-06 evening), in the order they ran; the code each ran at is named.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-06-zen4-prompt-lanes
lscpu > $R/lscpu.txt
# at a997bfa (lane-wise prompt tiles, one bf16 per probability; head plain): serving against vLLM's CPU build at
# bf16, the tiles on, then off
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/lanes-on benchmarks/compare.sh
TOKENMILL_PROMPT_LANES=0 PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/lanes-off benchmarks/compare.sh
# at 2907c89 (the output layer packed too): n-gram speculation on the grounded workload, the head packed (1) and
# plain (0), alternating, two rounds
for i in 1 2; do for e in 1 0; do
  TOKENMILL_VNNI_PACK_HEAD=$e .venv/bin/tokenmill bench spec --workload grounded --concurrency 1 --repeats 4 --output-len 128 \
      --speculative-config '{"method": "ngram"}' --result-json $R/spec-head-ab/head$e-$i.json > /dev/null
done; done
# decode-only steps, the head packed and plain (one stream, 16 requests)
.venv/bin/python benchmarks/experiments/decode_step_rows.py 1 A=1 TOKENMILL_VNNI_PACK_HEAD=0 > $R/decode_step_rows.txt
.venv/bin/python benchmarks/experiments/decode_step_rows.py 16 A=1 TOKENMILL_VNNI_PACK_HEAD=0 >> $R/decode_step_rows.txt
# memory with the head packed and plain
.venv/bin/python benchmarks/experiments/engine_rss.py > $R/rss.txt
TOKENMILL_VNNI_PACK_HEAD=0 .venv/bin/python benchmarks/experiments/engine_rss.py >> $R/rss.txt
# serving at 2907c89 against both peers, then a second round against vLLM
PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/head-packed benchmarks/compare.sh
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/head-packed-round2 benchmarks/compare.sh
# at 960343e (each probability as two bf16: the final code): prompt rows' attention (torch SDPA, the decode
# tiles, the lane-wise tiles; 30 layers of the default model's shapes), a C=64 step's time with the tiles on and
# off, and the final serving sweep against both peers
.venv/bin/python benchmarks/experiments/prefill_attention_ab.py bf16 0:200 0:512 88:112 300:212 > $R/prefill_attention_ab.txt
.venv/bin/python benchmarks/experiments/step_breakdown.py 64 > $R/step_breakdown.txt
TOKENMILL_PROMPT_LANES=0 .venv/bin/python benchmarks/experiments/step_breakdown.py 64 >> $R/step_breakdown.txt
PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/final benchmarks/compare.sh
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/final-round2 benchmarks/compare.sh
