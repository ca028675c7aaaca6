#!/usr/bin/env bash
# The commands behind this directory (2026-12-06, early morning stop; AMX Xeon, lscpu.txt).
set -eu
D=benchmarks/results/2026-12-06-amx
M5=$HOME/.cache/tokenmill/big/qwen2.5-7b-shape-Q5_K_M.gguf
case "${1:-}" in
  kernels) for t in 12 14; do TYPES=$t ROWS=1,2,4,8,16 .venv/bin/python benchmarks/experiments/kquant_vs_ggml.py; done \
             | tee $D/kquant_vs_ggml.txt
           Q4K_AS=13 TYPES=13 ROWS=1,2,4,8,16 .venv/bin/python benchmarks/experiments/kquant_vs_ggml.py | tee -a $D/kquant_vs_ggml.txt ;;
  big) LOAD_C=0 RESULTS_DIR=$D/big-model bash benchmarks/big_model.sh ;;
  big2) LOAD_C=16 RESULTS_DIR=$D/big-model/round2 bash benchmarks/big_model.sh ;;
  q5) [[ -f $M5 ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf $M5 --preset qwen2.5-7b --mix q5_k_m
      MODEL=$M5 LOAD_C=0 RESULTS_DIR=$D/big-model-q5km bash benchmarks/big_model.sh ;;
  fp32-plain) for v in 0 1; do TOKENMILL_Q4K_PLAIN=$v TOKENMILL_AMX_MATMUL=0 TOKENMILL_ARGS="--dtype float32" PEERS="" \
                LOAD_C=0 RESULTS_DIR=$D/fp32-noamx-q4k-plain-$v bash benchmarks/big_model.sh; done ;;
  r1) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/r1 benchmarks/compare.sh ;;
  *) echo "usage: $0 kernels|big|big2|q5|fp32-plain|r1" >&2; exit 2 ;;
esac
