#!/usr/bin/env bash
# The native decode step on Qwen3 (q / k norms) and Qwen3-MoE (experts in one tm_moe call inside the step) against
# llama-server, side by side in one run each, on real-shaped random files (tokenmill/benchmarks/random_gguf.py
# presets; made on first use); and the in-process A/B of the decode step layer by layer against the native step
# (ab_native.py) at one stream and at C=8. From the repository root. ONLY=<preset> runs one.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-native-qwen3
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
lscpu > "$D/lscpu.txt"
for spec in "qwen3-4b q4_k_m Q4_K_M" "qwen3-30b-a3b-16l q4_k_m Q4_K_M"; do
  set -- $spec
  [[ -z ${ONLY:-} || $ONLY == "$1" ]] || continue
  f=$BIG/$1-shape-$3.gguf
  [[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset $1 --mix $2
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
  [[ ${SKIP_AB:-0} == 1 ]] || { .venv/bin/python $D/ab_native.py "$f" 1; .venv/bin/python $D/ab_native.py "$f" 8; } 2>&1 \
    | grep -v "^INFO\|WARN" > "$D/$1.ab.txt"
  uptime | tee "$D/$1.uptime"
  MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/$1 bash benchmarks/big_model.sh > "$D/$1.log" 2>&1
done
