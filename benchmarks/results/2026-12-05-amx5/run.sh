#!/usr/bin/env bash
# The commands behind this directory (2026-12-05, second evening stop; AMX Xeon, lscpu.txt).
set -eu
D=benchmarks/results/2026-12-05-amx5
case "${1:-}" in
  r1) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/$1 benchmarks/compare.sh ;;
  spec-rows) for a in 4 3 4 3; do echo "AMXMIN=$a"; AMXMIN=$a .venv/bin/python benchmarks/experiments/spec_step_rows.py; done ;;
  head) .venv/bin/python benchmarks/experiments/head_dense_vs_amx.py 256 | tee $D/head_dense_vs_amx.txt ;;
  spec) bash benchmarks/spec_grounded.sh $D/spec ;;
  draft-length) .venv/bin/python benchmarks/experiments/draft_length_ab.py | tee $D/draft_length_ab.txt ;;
  ceiling) for n in 1 2 3; do for c in summarise_quotes code_edit; do
             echo "MIN_N=$n $c: $(MIN_N=$n .venv/bin/python benchmarks/experiments/draft_ceiling.py $c | grep '^steps')"
           done; done | tee $D/draft_ceiling.txt ;;
  ties) .venv/bin/python benchmarks/experiments/head_ties_acceptance.py | tee $D/head_ties_acceptance.txt ;;
  head-rows) .venv/bin/python benchmarks/experiments/head_rows_kernel_vs_dense.py | tee $D/head_rows_kernel_vs_dense.txt ;;
  arenas) for r in 1 2; do .venv/bin/python benchmarks/experiments/malloc_arenas_ab.py default
            MALLOC_ARENA_MAX=1 .venv/bin/python benchmarks/experiments/malloc_arenas_ab.py arena1; done ;;
  *) echo "usage: $0 r1|spec-rows|head|spec|draft-length|ceiling|ties|head-rows|arenas" >&2; exit 2 ;;
esac
