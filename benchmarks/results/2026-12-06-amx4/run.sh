#!/usr/bin/env bash
# 2026-12-06, late morning, AMX Xeon (lscpu.txt), from the repository root: bash benchmarks/results/2026-12-06-amx4/run.sh MODE
#   kernels: the three verification-row attempts (block_rows_hot.txt, block_pairs_ab.txt, amx_int8.txt, amx_chunks.txt;
#            the patched trees were /tmp copies of tokenmill/native with benchmarks/experiments/*.patch applied)
#   serve:   the default model at this host's own code (bf16) after the attention kernel's softcap argument:
#            one stream against llama-server (NO_AMX build, its repacked layouts), C=16 / 64 against vLLM bf16
set -euo pipefail
R=benchmarks/results/2026-12-06-amx4
case "${1:?mode: kernels | serve}" in
    kernels)
        .venv/bin/python benchmarks/experiments/block_rows_hot.py tokenmill/native/block_matmul.cpp /tmp/pairs_dir/block_matmul.cpp
        ROWS=1,2,3,4,5,6,7,8,16 .venv/bin/python benchmarks/experiments/block_matmul_ab.py tokenmill/native/block_matmul.cpp /tmp/pairs_dir/block_matmul.cpp
        ROWS=1,2,3,4,5,6,7,8,16 .venv/bin/python benchmarks/experiments/block_matmul_ab.py /tmp/pairs_dir/block_matmul.cpp tokenmill/native/block_matmul.cpp
        .venv/bin/python benchmarks/experiments/amx_int8_vs.py 1
        FAKE_B=1 .venv/bin/python benchmarks/experiments/amx_int8_vs.py 1
        T=2 L=30 .venv/bin/python benchmarks/experiments/amx_ab.py MAIN.so PATCHED.so ;;  # built by build_library
    serve) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$R/serve benchmarks/compare.sh ;;
esac
