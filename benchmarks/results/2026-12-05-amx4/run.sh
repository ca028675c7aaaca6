#!/usr/bin/env bash
# The commands behind benchmarks/README.md's section "Weight rows prefetched ahead; llama-server at its best
# on AMX" (2026-12-05, night), on the AMX Xeon of lscpu.txt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=benchmarks/results/2026-12-05-amx4
case "${1:-}" in
  # the llama-server build without AMX kernels (repacked layouts on) against tokenmill before the prefetch
  llama-noamx) PEERS="llama-server" LEVELS=1,16,64 RESULTS_DIR=$D/llama-noamx benchmarks/compare.sh ;;
  # the 7B-class file against that build (before the prefetch: the 7B file's matmuls are ggml's)
  big) RESULTS_DIR=$D/big-model bash benchmarks/big_model.sh ;;
  big2) LOAD_C=0 RESULTS_DIR=$D/big-model/round2 bash benchmarks/big_model.sh ;;
  r1|r2) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/$1 benchmarks/compare.sh ;;
  # one stream, engine alone: decode step times before (git stash) and after, back to back
  one-stream) .venv/bin/python benchmarks/experiments/one_stream.py ;;
  # the default model's 120 layer matmuls, the previous kernel against this one, rows 1-16
  prefetch-ab) git show d1acbdd:tokenmill/native/block_matmul.cpp > /tmp/block_matmul_before.cpp
    ROWS=1,2,4,8,16 .venv/bin/python benchmarks/experiments/block_matmul_ab.py /tmp/block_matmul_before.cpp \
      tokenmill/native/block_matmul.cpp | tee $D/prefetch_ab.txt ;;
  spec) bash benchmarks/spec_grounded.sh $D/spec ;;
  spec-random)
    for C in 1 16 64; do
      .venv/bin/tokenmill bench spec --workload random --concurrency $C --repeats 4 --output-len 64 \
        --result-json $D/spec/random-c$C.json >/dev/null
    done ;;
  *) echo "usage: $0 llama-noamx|big|big2|r1|r2|one-stream|prefetch-ab|spec|spec-random" >&2; exit 2 ;;
esac
