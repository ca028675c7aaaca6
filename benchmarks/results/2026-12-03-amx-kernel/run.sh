#!/usr/bin/env bash
# Issue 10 on an AMX Xeon (2026-12-03, midday): the serving comparison against vLLM's CPU build at bf16
# (its own choice here; the best peer at C=16 and C=64) after the AMX block kernel, then tokenmill alone
# with the kernel off (TOKENMILL_AMX_MATMUL=0: the dense copy and the integer block kernel, as before),
# in the same session. Run from the repository root: bash benchmarks/results/2026-12-03-amx-kernel/run.sh
set -u
D=benchmarks/results/2026-12-03-amx-kernel
lscpu > $D/lscpu.txt
PEERS="vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/compare benchmarks/compare.sh
TOKENMILL_AMX_MATMUL=0 PEERS="" LEVELS=1,16,64 RESULTS_DIR=$D/kernel-off benchmarks/compare.sh
# round 2, after AMX_MIN_ROWS (round 1's C=1 ran one-row steps on the AMX kernel: 22.1 tok/s)
PEERS="vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/compare-2 benchmarks/compare.sh
PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/compare-3 benchmarks/compare.sh  # round 3, at the final commit
