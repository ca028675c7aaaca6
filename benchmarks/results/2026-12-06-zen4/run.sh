#!/usr/bin/env bash
# The commands behind benchmarks/results/2026-12-06-zen4/ (issue 10 on the Zen 4 kind, 2026-12-06 midday), in order.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/2026-12-06-zen4
lscpu > $R/lscpu.txt
# before (e7abc61: the bf16 dense copy past the crossover, prefill attention on SDPA at bf16)
PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R benchmarks/compare.sh
# the 8-bit VNNI panel kernel (no dense copy; opt-in since 1beffb0)
TOKENMILL_VNNI_MATMUL=1 PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/vnni benchmarks/compare.sh
# ... and prefill attention on the native kernel at bf16 (CPUs without AMX)
TOKENMILL_VNNI_MATMUL=1 PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/vnni-prefill benchmarks/compare.sh
# where a C=64 step goes, each lever on and off
TOKENMILL_NATIVE_PREFILL=0 .venv/bin/python benchmarks/experiments/step_breakdown.py 64
TOKENMILL_VNNI_MATMUL=1 .venv/bin/python benchmarks/experiments/step_breakdown.py 64
# the kernel against the prepacked bf16 copy, and the agreement of each path with the fp32 reference
.venv/bin/python benchmarks/experiments/vnni_vs_bf16.py > $R/vnni_vs_bf16.txt
.venv/bin/python benchmarks/experiments/vnni_agreement.py > $R/agreement.txt
.venv/bin/python benchmarks/experiments/prefill_attention_ab.py bf16 0:200 0:512 88:112 300:212 0:64 > $R/prefill_attention_bf16.txt
# issue 15 on this kind at the final code, and with the bf16 copy (TOKENMILL_VNNI_MATMUL=0) for the texts' sake
TOKENMILL_VNNI_MATMUL=1 bash benchmarks/spec_grounded.sh $R/spec
TOKENMILL_VNNI_MATMUL=0 bash benchmarks/spec_grounded.sh $R/spec-bf16copy
TOKENMILL_VNNI_MATMUL=1 TAG=vnni-panel .venv/bin/python benchmarks/experiments/grounded_text.py > $R/code_edit_texts.txt
TOKENMILL_VNNI_MATMUL=0 TAG=bf16-copy .venv/bin/python benchmarks/experiments/grounded_text.py >> $R/code_edit_texts.txt
# the 7B file before / after the Q4_K rule (the VNNI panel does not take K-quants), the default model's memory (VNNI on)
RESULTS_DIR=$R/big-model bash benchmarks/big_model.sh            # at 33a9a58, before 0bf7516
RESULTS_DIR=$R/big-model-repacked bash benchmarks/big_model.sh
TOKENMILL_VNNI_MATMUL=1 MODEL=<default gguf> MAX_MODEL_LEN=2048 RESULTS_DIR=$R/memory-default bash benchmarks/big_model.sh
# the default at the final code (bf16 copy + native prefill at bf16)
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$R/default-final benchmarks/compare.sh
