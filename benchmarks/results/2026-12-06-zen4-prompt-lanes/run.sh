#!/usr/bin/env bash
# The commands behind benchmarks/results/2026-12-06-zen4-prompt-lanes/ (issue 10 on the Zen 4 kind, 2026-12-06
# evening), in order.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-06-zen4-prompt-lanes
lscpu > $R/lscpu.txt
# prompt rows' attention: torch SDPA, the decode tiles, the lane-wise tiles (30 layers of the default model's shapes)
.venv/bin/python benchmarks/experiments/prefill_attention_ab.py bf16 0:200 0:512 88:112 300:212 > $R/prefill_attention_ab.txt
# where a C=64 step's time goes, the lane-wise tiles on and off
.venv/bin/python benchmarks/experiments/step_breakdown.py 64 > $R/step_breakdown.txt
TOKENMILL_PROMPT_LANES=0 .venv/bin/python benchmarks/experiments/step_breakdown.py 64 >> $R/step_breakdown.txt
# serving against vLLM's CPU build at bf16: the final code, then the same with the lane-wise tiles off
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/final benchmarks/compare.sh
TOKENMILL_PROMPT_LANES=0 PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/lanes-off benchmarks/compare.sh
