#!/usr/bin/env bash
# The commands behind this directory (2026-12-05, second evening stop; AMX Xeon, lscpu.txt).
set -eu
D=benchmarks/results/2026-12-05-amx5
case "${1:-}" in
  spec-rows) for a in 4 3 4 3; do echo "AMXMIN=$a"; AMXMIN=$a .venv/bin/python benchmarks/experiments/spec_step_rows.py; done ;;
  head) .venv/bin/python benchmarks/experiments/head_dense_vs_amx.py 256 | tee $D/head_dense_vs_amx.txt ;;
  *) echo "usage: $0 spec-rows|head" >&2; exit 2 ;;
esac
