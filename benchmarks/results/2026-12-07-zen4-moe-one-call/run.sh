#!/usr/bin/env bash
# The MoE one-call path and LFM2's short conv kernel against llama-server, side by side in one run each, on the
# real-shaped random files (tokenmill/benchmarks/random_gguf.py presets; made on first use). From the repository
# root. Also the in-process A/B of the MoE layers before / after (ab_moe.py) on each file. ONLY=<preset> runs one.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-moe-one-call
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
lscpu > "$D/lscpu.txt"
for spec in "lfm2-8b-a1b q4_k_m Q4_K_M" "granite-4.0-h-tiny q4_k_m Q4_K_M" "gpt-oss-20b mxfp4_moe MXFP4"; do
  set -- $spec
  [[ -z ${ONLY:-} || $ONLY == "$1" ]] || continue
  f=$BIG/$1-shape-$3.gguf
  [[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset $1 --mix $2
  uptime | tee "$D/$1.uptime"
  MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/$1 bash benchmarks/big_model.sh > "$D/$1.log" 2>&1
  [[ ${SKIP_AB:-0} == 1 ]] || .venv/bin/python $D/ab_moe.py "$f" 2>&1 | grep -v "^INFO\|WARN" > "$D/$1.ab.txt"
done
