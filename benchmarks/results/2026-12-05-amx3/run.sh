#!/usr/bin/env bash
# The commands behind benchmarks/README.md's section "bf16 rows through the AMX kernel, greedy picks
# without a float32 copy" (2026-12-05, evening), on the AMX Xeon of lscpu.txt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=benchmarks/results/2026-12-05-amx3
case "${1:-}" in
  # offline 64 x 200 -> 64, alternating the session's first commit (a worktree at $BEFORE) with this one
  offline)
    for r in 1 2; do for side in before after; do
      tree=$([[ $side == before ]] && echo "$BEFORE" || echo "$PWD")
      (cd "$tree" && PYTHONPATH="$tree" "$OLDPWD/.venv/bin/python" -m tokenmill.cli bench throughput --num-prompts 64 \
        --input-len 200 --output-len 64 --result-json "$OLDPWD/$D/offline-$side-$r.json" >/dev/null)
    done; done ;;
  # where a C=64 step goes (mixed and decode-only)
  breakdown) .venv/bin/python benchmarks/experiments/step_breakdown.py 64 | tee "$D/step_breakdown.txt" ;;
  r1|r2) PEERS="vllm-bf16" LEVELS=16,64 RESULTS_DIR=$D/$1 benchmarks/compare.sh ;;
  r3) PEERS="llama-server vllm-bf16" LEVELS=1,16,64 RESULTS_DIR=$D/r3 benchmarks/compare.sh ;;
  # n-gram speculation on the grounded prompts, twice (issue 15)
  spec) bash benchmarks/spec_grounded.sh $D/spec ;;
  # random prompts with speculation on and off at C=16 and C=64 (the rule must keep >= 0.97x)
  spec-random)
    for C in 16 64; do
      .venv/bin/tokenmill bench spec --workload random --concurrency $C --repeats 4 --output-len 64 \
        --result-json $D/spec/random-c$C.json >/dev/null
    done ;;
  # the 7B-class file (Q4_K_M, random weights): memory and one stream against llama-server
  big) RESULTS_DIR=$D/big-model bash benchmarks/big_model.sh ;;
  *) echo "usage: $0 offline|breakdown|r1|r2|r3|spec|spec-random|big" >&2; exit 2 ;;
esac
