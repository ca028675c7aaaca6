#!/usr/bin/env bash
# Prefix caching for a model with recurrent layers (benchmarks/README.md, "Multi-turn chats on Qwen3.5"): tokenmill
# with its state checkpoints, tokenmill with --no-prefix-caching, and llama-server (its own state checkpoints) on
# the same Qwen3.5-0.8B-shaped Q8_0 file, one stream, benchmarks/chat_turns.py, in ROUNDS alternating rounds.
# From the repository root.
set -euo pipefail
D=benchmarks/results/2026-12-07-zen4-state-cache
BIG="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}/big"
MODEL=$BIG/qwen3.5-0.8b-shape-Q8_0.gguf
NAME=$(basename "$MODEL" .gguf)
ROUNDS="${ROUNDS:-2}"
PORT=8431
THREADS=$(nproc)
lscpu > "$D/lscpu.txt"
[[ -f $MODEL ]] || .venv/bin/python -m tokenmill.benchmarks.random_gguf "$MODEL" --preset qwen3.5-0.8b --mix q8_0
BIN="$(benchmarks/peers/build_llama_server.sh | tail -1)"
CHAT=(--conversations 3 --turns 4 --system-words 400 --user-words 30 --max-tokens 32 --shared-system)

serve_and_run() {  # label, then the server's command
    local label=$1; shift
    "$@" > "$D/$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 300); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
    uptime >> "$D/load.txt"
    .venv/bin/python benchmarks/chat_turns.py --base-url "http://127.0.0.1:$PORT" --model "$NAME" "${CHAT[@]}" \
        --label "$label" --out "$D/$label-r$r.json" | tee -a "$D/summary.txt"
    kill -TERM $pid; wait $pid || true
}

: > "$D/summary.txt"; : > "$D/load.txt"
for r in $(seq "$ROUNDS"); do
    serve_and_run tokenmill .venv/bin/tokenmill serve "$MODEL" --port $PORT --max-model-len 4096 \
        --kv-cache-memory 2GiB --num-threads "$THREADS"
    serve_and_run tokenmill-no-prefix-caching .venv/bin/tokenmill serve "$MODEL" --port $PORT --max-model-len 4096 \
        --kv-cache-memory 2GiB --num-threads "$THREADS" --no-prefix-caching
    serve_and_run llama-server "$BIN" -m "$MODEL" --port $PORT --parallel 1 --ctx-size 4096 --threads "$THREADS" \
        --threads-batch "$THREADS" --alias "$NAME"
done
