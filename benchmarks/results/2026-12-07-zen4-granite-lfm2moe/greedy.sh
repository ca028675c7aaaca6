#!/usr/bin/env bash
# Part 1: tiny random models -> llama.cpp's converter (f32) -> tokenmill vs transformers (logits), vs llama-server (greedy).
# From the repository root. LCPP: llama.cpp's source (convert_hf_to_gguf.py + conversion/ + gguf-py/).
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-granite-lfm2moe
LCPP=${LCPP:-/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp}
T=${T:-/tmp/glchk}
BIN=${BIN:-$HOME/.cache/tokenmill/llama-server/bin/llama-server}
PY=$PWD/.venv/bin/python
$PY $D/make_hf.py $T
for n in granite-moe granite-dense lfm2moe; do
  (cd "$LCPP" && $PY $OLDPWD/benchmarks/results/2026-12-07-zen4-qwen35/convert_with_llama_cpp.py "$T/$n/hf" \
     --outtype f32 --outfile "$T/$n/conv.gguf") > "$T/$n/convert.log" 2>&1
done
: > $D/greedy.txt
port=8093
for n in granite-moe granite-dense lfm2moe; do
  "$BIN" -m "$T/$n/conv.gguf" --threads 2 --ctx-size 2048 --parallel 1 --port $port > "$T/$n/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
  $PY $D/greedy.py "$T" "$n" $port 2>&1 | grep -E "^$n:" | tee -a $D/greedy.txt
  kill $pid; wait $pid 2>/dev/null || true
done
