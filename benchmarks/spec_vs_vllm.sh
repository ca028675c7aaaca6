#!/usr/bin/env bash
# Issue 15's peer check: the grounded workload (benchmarks/prompts/spec_grounded.json, C=1, greedy) against
# tokenmill and vLLM's CPU build, each served without speculation and with n-gram speculation, one client
# (benchmarks/spec_serve.py), one run. The prompts go as the same token ids to every server.
#
#   bash benchmarks/spec_vs_vllm.sh            (RESULTS_DIR, REPEATS, OUTPUT_LEN, VDTYPE, SPEC_K to change)
#
# vLLM's config: {"method": "ngram", "num_speculative_tokens": SPEC_K, "prompt_lookup_min": 2,
# "prompt_lookup_max": 5}; tokenmill's: {"method": "ngram"} (the same k, min and max by default, and its
# adaptive draft length). vLLM at VDTYPE (default bfloat16, its own choice on an AMX CPU; tokenmill's
# --dtype auto picks the same there). Needs the peers compare.sh sets up (make compare builds them).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/benchmarks/results/$(date +%Y-%m-%d)-spec-vllm}"
REPEATS="${REPEATS:-4}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
VDTYPE="${VDTYPE:-bfloat16}"
SPEC_K="${SPEC_K:-4}"
PORT="${PORT:-8331}"
THREADS="$(nproc)"
CACHE="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}"
URL="http://127.0.0.1:$PORT"
MODEL="$("$PYTHON" -c 'from tokenmill.loader.model_source import default_model_path; print(default_model_path())')"
NAME="$(basename "$MODEL" .gguf)"
mkdir -p "$RESULTS_DIR"
lscpu >"$RESULTS_DIR/lscpu.txt"
IDS="$RESULTS_DIR/prompt-ids.json"
PID=""
stop() { [[ -z "$PID" ]] && return; kill -TERM -- "-$PID" 2>/dev/null; for _ in $(seq 30); do kill -0 "$PID" 2>/dev/null || break; sleep 1; done
         kill -KILL -- "-$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=""; }
trap stop EXIT
start() {  # start LABEL CMD...
    local label="$1"; shift
    echo "[$(date +%T)] $label: $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$RESULTS_DIR/load.txt"
    setsid "$@" >"$RESULTS_DIR/$label.log" 2>&1 &
    PID=$!
    for _ in $(seq 900); do
        curl -sf "$URL/v1/models" >/dev/null 2>&1 && return 0
        kill -0 "$PID" 2>/dev/null || { echo "$label exited:"; tail -20 "$RESULTS_DIR/$label.log"; PID=""; return 1; }
        sleep 1
    done
    echo "$label did not start"; stop; return 1
}
measure() {  # measure LABEL
    "$PYTHON" benchmarks/spec_serve.py --url "$URL" --model "$NAME" --ids "$IDS" --repeats "$REPEATS" \
        --output-len "$OUTPUT_LEN" --label "$1" --json "$RESULTS_DIR/$1.json" | tee -a "$RESULTS_DIR/summary.txt"
}
TM=("$PYTHON" -m tokenmill.cli serve "$MODEL" --port "$PORT" --served-model-name "$NAME")
start tokenmill-off "${TM[@]}" && { [[ -f "$IDS" ]] || "$PYTHON" benchmarks/spec_serve.py --url "$URL" --ids "$IDS" --make-ids; } \
    && measure tokenmill-off; stop
start tokenmill-ngram "${TM[@]}" --speculative-config '{"method": "ngram"}' && measure tokenmill-ngram; stop

source benchmarks/peers/vllm_serve.sh
vllm_serve_cmd "$PYTHON" "$MODEL" "$CACHE" "$PORT" "$VDTYPE" 2048 4
VLLM=("${VLLM_CMD[@]}")
start vllm-off "${VLLM[@]}" && measure vllm-off; stop
start vllm-ngram "${VLLM[@]}" --speculative-config \
    "{\"method\": \"ngram\", \"num_speculative_tokens\": $SPEC_K, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}" \
    && measure vllm-ngram; stop
"$PYTHON" - "$RESULTS_DIR" <<'EOF' | tee "$RESULTS_DIR/ratios.txt"
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in d.glob("*.json") if p.stem != "prompt-ids"}
for server in ("tokenmill", "vllm"):
    off, on = runs.get(f"{server}-off"), runs.get(f"{server}-ngram")
    if not (off and on):
        print(f"{server}: not measured (see its logs)")
        continue
    for case, c in off["cases"].items():
        o = on["cases"][case]
        same = "same text" if o["text"] == c["text"] else "TEXT DIFFERS"
        print(f"{server} {case}: off {c['tok_per_s']:.1f} tok/s, ngram {o['tok_per_s']:.1f} tok/s, "
              f"speed-up {o['tok_per_s'] / c['tok_per_s']:.2f}x ({same})")
if runs.get("tokenmill-ngram") and runs.get("vllm-ngram"):
    for case, c in runs["tokenmill-ngram"]["cases"].items():
        print(f"ngram {case}: tokenmill / vllm {c['tok_per_s'] / runs['vllm-ngram']['cases'][case]['tok_per_s']:.2f}x")
EOF
