#!/usr/bin/env bash
# Qwen3.5's dense layers in the native decode step (Gated DeltaNet and gated attention), on random-weight files in
# Qwen3.5-0.8B's (Q8_0) and -4B's (Q4_K_M) shapes: this stop's start (a22a9b3, `git worktree add /tmp/oldwt a22a9b3`)
# against new in alternating processes (one_stream.py), then side by side with llama-server (big_model.sh, as the
# 2026-12-07 Qwen3.5 run). From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-native-qwen35
S=benchmarks/results/2026-12-07-zen4-native-gemma/one_stream.py  # (MODEL: the file)
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
lscpu > "$D/lscpu.txt"
for spec in "qwen3.5-0.8b q8_0 Q8_0" "qwen3.5-4b q4_k_m Q4_K_M"; do
  set -- $spec
  f=$BIG/$1-shape-$3.gguf
  [[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset $1 --mix $2
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
  uptime | tee -a "$D/uptime.txt"
  for i in 1 2; do
    (cd /tmp/oldwt && MODEL=$f PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/$S" "old $1" 2>&1 | grep "best of")
    MODEL=$f .venv/bin/python "$S" "new $1" 2>&1 | grep "best of"
  done | tee -a "$D/old_new.txt"
  uptime | tee -a "$D/uptime.txt"
  MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/$1 bash benchmarks/big_model.sh > "$D/$1.log" 2>&1
done
uptime | tee -a "$D/uptime.txt"
