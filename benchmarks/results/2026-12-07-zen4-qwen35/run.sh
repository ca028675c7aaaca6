#!/usr/bin/env bash
# Qwen3.5 against llama-server (benchmarks/README.md, "Qwen3.5 against llama-server"). From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-qwen35
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
lscpu > "$D/lscpu.txt"
[[ -f $BIG/qwen3.5-4b-shape-Q4_K_M.gguf ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf \
    "$BIG/qwen3.5-4b-shape-Q4_K_M.gguf" --preset qwen3.5-4b --mix q4_k_m
[[ -f $BIG/qwen3.5-0.8b-shape-Q8_0.gguf ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf \
    "$BIG/qwen3.5-0.8b-shape-Q8_0.gguf" --preset qwen3.5-0.8b --mix q8_0
MODEL=$BIG/qwen3.5-4b-shape-Q4_K_M.gguf MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/q4b bash benchmarks/big_model.sh
MODEL=$BIG/qwen3.5-0.8b-shape-Q8_0.gguf MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/q08b bash benchmarks/big_model.sh
