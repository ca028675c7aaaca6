#!/usr/bin/env bash
# gpt-oss-20b's shapes (MXFP4 experts, the rest Q8_0) after the native decode step took gpt-oss: the in-process
# A/B (ab_native.py, one stream) and side by side with llama-server. From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-08-zen4-native-qwen3
f="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big/gpt-oss-20b-shape-MXFP4.gguf"
[[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset gpt-oss-20b --mix mxfp4_moe
sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
.venv/bin/python $D/ab_native.py "$f" 1 2>&1 | grep -v "^INFO\|WARN" > "$D/gpt-oss-20b.ab.txt"
uptime | tee "$D/gpt-oss-20b.uptime"
MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/gpt-oss-20b bash benchmarks/big_model.sh > "$D/gpt-oss-20b.log" 2>&1
