#!/usr/bin/env bash
# The commands behind benchmarks/README.md's section "AVX-512 loops for the small kernels and decode
# attention, Q4_K / Q6_K on the AMX kernel" (2026-12-05, afternoon), on the AMX Xeon of lscpu.txt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=benchmarks/results/2026-12-05-amx2
case "${1:-}" in
  # the kernels, 8 lanes (-DTM_NO_AVX512) against 16, in one process
  kernels) .venv/bin/python benchmarks/experiments/avx512_ab.py ;;
  # offline 64 x 200 -> 64, alternating the previous commit (a worktree at $BEFORE) with this one, 3 rounds
  offline)
    for r in 1 2 3; do for side in before after; do
      tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$PWD")
      (cd "$tree" && PYTHONPATH="$tree" "$OLDPWD/.venv/bin/python" -m tokenmill.cli bench throughput --num-prompts 64 \
        --input-len 200 --output-len 64 --result-json "$OLDPWD/$D/offline-$side-$r.json" >/dev/null)
    done; done ;;
  r1) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/r1 benchmarks/compare.sh ;;
  r2|r3|r4) PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/$1 benchmarks/compare.sh ;;
  # the 7B-class file (Q4_K_M, random weights): memory and one stream against llama-server
  big) RESULTS_DIR=$D/big-model bash benchmarks/big_model.sh ;;
  # the K-quant path on and off, bench latency (128-token prompt) on the same file, back to back
  big-ab)
    for mode in 1 0; do
      TOKENMILL_AMX_K_QUANTS=$mode .venv/bin/python -m tokenmill.cli bench latency \
        --model ~/.cache/tokenmill/big/qwen2.5-7b-shape-Q4_K_M.gguf --input-len 128 --output-len 8 \
        --max-model-len 1024 --result-json "$D/big-latency-amx-k-$mode.json"
    done ;;
  *) echo "usage: $0 kernels|offline|r1|r2|r3|r4|big|big-ab" >&2; exit 2 ;;
esac
