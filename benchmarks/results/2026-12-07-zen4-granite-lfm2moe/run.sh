#!/usr/bin/env bash
# Granite 4.0-H and LFM2-MoE against llama-server. From the repository root.
# Part 1 (greedy.sh): tiny random HF models (tests/model/test_granite_hybrid.py "moe" / "dense", test_lfm2_moe.py)
# -> llama.cpp's own converter, f32:
#   cd $LCPP && .venv/bin/python benchmarks/results/2026-12-07-zen4-qwen35/convert_with_llama_cpp.py \
#       /tmp/glchk/<name>/hf --outtype f32 --outfile /tmp/glchk/<name>/conv.gguf
# -> tokenmill's prompt logits vs transformers (fp32, dequantize) and 32 greedy tokens vs llama-server -> greedy.txt.
# Part 2: real-shaped random Q4_K_M files (tokenmill/benchmarks/random_gguf.py presets) through big_model.sh.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-granite-lfm2moe
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
[[ ${SKIP_GREEDY:-0} == 1 ]] || bash $D/greedy.sh
lscpu > "$D/lscpu.txt"
for p in granite-4.0-h-tiny lfm2-8b-a1b; do
  f=$BIG/$p-shape-Q4_K_M.gguf
  [[ -f $f ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$f" --preset $p --mix q4_k_m
  uptime | tee "$D/$p.uptime"
  MODEL=$f MAX_MODEL_LEN=2048 LOAD_C=16 RESULTS_DIR=$D/$p bash benchmarks/big_model.sh > "$D/$p.log" 2>&1
  .venv/bin/python $D/decode_parts.py "$f" 20 2>&1 | grep -A30 "decode step" > "$D/$p.decode_parts.txt"
done
