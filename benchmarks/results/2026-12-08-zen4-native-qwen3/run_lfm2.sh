#!/usr/bin/env bash
# LFM2-8B-A1B's shapes (Q4_K_M) after the native decode step took LFM2: the in-process
# A/B (ab_native.py, one stream) and side by side with llama-server. From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-native-qwen3
f="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big/lfm2-8b-a1b-shape-Q4_K_M.gguf"
[[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset lfm2-8b-a1b --mix q4_k_m
sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
.venv/bin/python $D/ab_native.py "$f" 1 2>&1 | grep -v "^INFO\|WARN" > "$D/lfm2-8b-a1b.ab.txt"
uptime | tee "$D/lfm2-8b-a1b.uptime"
MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/lfm2-8b-a1b bash benchmarks/big_model.sh > "$D/lfm2-8b-a1b.log" 2>&1
