#!/usr/bin/env bash
# Issues 10 and 15 on an AMX Xeon (2026-12-05, the first AMX host since 2026-12-03): the serving comparison
# at today's code (one stream against llama-server, C=16 / C=64 against vLLM's CPU build at bf16, its own
# pick here), then issue 15's grounded speculation. Run from the repository root:
#   bash benchmarks/results/2026-12-05-amx/run.sh [compare|compare2|spec]
set -u
D=benchmarks/results/2026-12-05-amx
lscpu > $D/lscpu.txt
case "${1:-compare}" in
  compare) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/compare benchmarks/compare.sh ;;
  # at the final code (the 2048 budget on AMX), twice, then the speculation run again
  final) PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/final-1 benchmarks/compare.sh
         PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/final-2 benchmarks/compare.sh
         bash benchmarks/spec_grounded.sh $D/spec-final ;;
  final3) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/final-3 benchmarks/compare.sh ;;
  final4) PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/final-4 benchmarks/compare.sh ;;
  spec) bash benchmarks/spec_grounded.sh $D/spec ;;
esac
# the step's token budget at C=64, tokenmill alone, default (512) and 2048 alternating twice
if [ "${1:-}" = budget ]; then
  for r in 1 2; do
    PEERS="" LEVELS=64 RESULTS_DIR=$D/budget/b512-$r benchmarks/compare.sh
    TOKENMILL_ARGS="--max-num-batched-tokens 2048" PEERS="" LEVELS=64 RESULTS_DIR=$D/budget/b2048-$r benchmarks/compare.sh
  done
fi
# the budget at C=16 and C=64: 512, 1024, 2048 in turn
if [ "${1:-}" = budget2 ]; then
  for b in 512 1024 2048; do
    TOKENMILL_ARGS="--max-num-batched-tokens $b" PEERS="" LEVELS=16,64 RESULTS_DIR=$D/budget/c16-64-b$b benchmarks/compare.sh
  done
fi
