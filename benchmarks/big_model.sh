#!/usr/bin/env bash
# A 7B-class GGUF in its own size: memory (peak and idle RSS beside `tokenmill plan`'s prediction) and
# speed (one stream's prompt and decode tok/s) for tokenmill and llama-server on the same file.
#
#   benchmarks/big_model.sh                     # makes the file on first use (~4.7 GB, a few minutes)
#   MODEL=path.gguf benchmarks/big_model.sh     # any other GGUF
#
# The file has Qwen2.5-7B's shapes and random weights in a Q4_K_M mix, written by ggml's own quantizer
# (tokenmill/benchmarks/random_gguf.py): nothing is downloaded. Results go to $RESULTS_DIR (default
# benchmarks/results/<date>-big-model/): summary.md, each server's log and the bench JSONs.
# Knobs: INPUT_LEN / OUTPUT_LEN (default 128 / 32), NUM_PROMPTS (default 3), KV (default 1GiB),
# MAX_MODEL_LEN (default 1024), LOAD_C (concurrency of the RSS-under-load run, default 16, 0 skips it),
# PEERS (default "llama-server"; "" runs tokenmill alone), PORT (default 8331), TOKENMILL_ARGS (extra flags
# for tokenmill serve, e.g. --dtype float32), LLAMA_SERVER_ARGS (extra
# flags), NO_AMX: as in compare.sh (peers/llama_server_defaults.sh), llama-server runs with its repacked layouts, on a CPU with AMX from a
# build without ggml's AMX kernels (they segfault at this file's first step); NO_AMX=0 takes the AMX build
# with --no-repack, which also drops the repacked Q4_K tiles (what runs before 2026-12-05 measured).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
CACHE="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}"
MODEL="${MODEL:-$CACHE/big/qwen2.5-7b-shape-Q4_K_M.gguf}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-32}"
NUM_PROMPTS="${NUM_PROMPTS:-3}"
KV="${KV:-1GiB}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-1024}"
LOAD_C="${LOAD_C:-16}"
PEERS="${PEERS-llama-server}"
PORT="${PORT:-8331}"
TOKENMILL_ARGS="${TOKENMILL_ARGS:-}"  # extra flags for tokenmill serve (e.g. --dtype float32)
source benchmarks/peers/llama_server_defaults.sh  # NO_AMX, LLAMA_SERVER_ARGS
THREADS="${THREADS:-$(nproc)}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/benchmarks/results/$(date +%Y-%m-%d)-big-model}"
mkdir -p "$RESULTS_DIR"
"$PYTHON" -c "import httpx" 2>/dev/null || { echo "needs the bench extras: pip install -e '.[bench]'" >&2; exit 2; }

if [[ ! -f "$MODEL" ]]; then
    mkdir -p "$(dirname "$MODEL")"
    "$PYTHON" -m tokenmill.benchmarks.random_gguf "$MODEL" --preset qwen2.5-7b --mix q4_k_m
fi
SIZE=$(stat -c %s "$MODEL")

PID=""
stop() { if [[ -n "$PID" ]]; then kill -TERM -- "-$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; fi; }  # status 0 when nothing runs: the script's exit status is the trap's
trap stop EXIT
rss_kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }  # VmRSS / VmHWM of a pid, KiB
# the server's own process (setsid's child), the one that holds the memory
server_pid() { pgrep -g "$PID" -f "$1" | head -1; }

measure() {  # name, process pattern, command...
    local name="$1" pat="$2"; shift 2
    setsid "$@" >"$RESULTS_DIR/$name.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 900); do
        curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break
        kill -0 "$PID" 2>/dev/null || { echo "$name died, see $RESULTS_DIR/$name.log" >&2; exit 1; }
        sleep 1
    done
    local sp; sp="$(server_pid "$pat")"
    local idle hwm_load
    idle=$(rss_kib "$sp" VmRSS); hwm_load=$(rss_kib "$sp" VmHWM)
    "$PYTHON" -m tokenmill.cli --log-level warning bench serve --base-url "http://127.0.0.1:$PORT" \
        --model "$(basename "$MODEL" .gguf)" --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" --num-warmups 1 \
        --num-prompts "$NUM_PROMPTS" --max-concurrency 1 --result-json "$RESULTS_DIR/$name-c1.json" \
        >"$RESULTS_DIR/$name-c1.txt" 2>&1
    local under="-" hwm
    if (( LOAD_C > 0 )); then
        "$PYTHON" -m tokenmill.cli --log-level warning bench serve --base-url "http://127.0.0.1:$PORT" \
            --model "$(basename "$MODEL" .gguf)" --random-input-len 32 --random-output-len 16 --num-warmups 0 --num-prompts "$LOAD_C" \
            --max-concurrency "$LOAD_C" --result-json "$RESULTS_DIR/$name-c$LOAD_C.json" \
            >"$RESULTS_DIR/$name-c$LOAD_C.txt" 2>&1 &
        local bp=$! peak=0 r
        while kill -0 "$bp" 2>/dev/null; do
            r=$(rss_kib "$sp" VmRSS); (( r > peak )) && peak=$r; sleep 1
        done
        under=$((peak / 1024))
    fi
    hwm=$(rss_kib "$sp" VmHWM)
    echo "| $name | $((hwm_load / 1024)) | $((idle / 1024)) | $under | $((hwm / 1024)) |" >>"$RESULTS_DIR/memory.md"
    stop
}

: >"$RESULTS_DIR/memory.md"
"$PYTHON" -m tokenmill.cli plan "$MODEL" --kv-cache-memory "$KV" --max-model-len "$MAX_MODEL_LEN" \
    >"$RESULTS_DIR/plan.txt"
measure tokenmill "tokenmill.cli serve" "$PYTHON" -m tokenmill.cli serve "$MODEL" --port "$PORT" \
    --kv-cache-memory "$KV" --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$((LOAD_C > 4 ? LOAD_C : 4))" \
    --num-threads "$THREADS" $TOKENMILL_ARGS
for peer in $PEERS; do
    BIN="$(benchmarks/peers/build_llama_server.sh | tail -1)"
    echo "llama-server binary: $BIN" >&2
    measure llama-server llama-server "$BIN" -m "$MODEL" --port "$PORT" --parallel "$((LOAD_C > 4 ? LOAD_C : 4))" \
        --ctx-size "$(( (LOAD_C > 4 ? LOAD_C : 4) * 256 > MAX_MODEL_LEN ? (LOAD_C > 4 ? LOAD_C : 4) * 256 : MAX_MODEL_LEN ))" \
        --threads "$THREADS" --threads-batch "$THREADS" --alias "$(basename "$MODEL" .gguf)" $LLAMA_SERVER_ARGS
done

{
    echo "# A big GGUF ($(basename "$MODEL")), $(date +%Y-%m-%d)"
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; flags:" \
         "$(for f in avx2 avx512f amx_bf16; do grep -qw $f /proc/cpuinfo && printf '%s yes ' $f || printf '%s no ' $f; done)"
    echo "Model: $(basename "$MODEL"), $(( SIZE / 1024 / 1024 )) MiB on disk. Command: benchmarks/big_model.sh" \
         "(${TOKENMILL_NATIVE_ISA:+TOKENMILL_NATIVE_ISA=$TOKENMILL_NATIVE_ISA }INPUT_LEN=$INPUT_LEN OUTPUT_LEN=$OUTPUT_LEN NUM_PROMPTS=$NUM_PROMPTS KV=$KV LOAD_C=$LOAD_C TOKENMILL_ARGS=$TOKENMILL_ARGS NO_AMX=${NO_AMX:-0} LLAMA_SERVER_ARGS=$LLAMA_SERVER_ARGS)"
    echo
    echo '`tokenmill plan` says:'
    echo '```'
    cat "$RESULTS_DIR/plan.txt"
    echo '```'
    echo
    echo "Memory (MiB): peak RSS by the time it answers, RSS idle, peak RSS during $LOAD_C concurrent requests" \
         "(32 in / 16 out), peak RSS over the whole run."
    echo
    echo "| server | peak at ready | idle | under load | peak overall |"
    echo "|---|---|---|---|---|"
    cat "$RESULTS_DIR/memory.md"
    echo
    echo "Speed, one stream ($INPUT_LEN in / $OUTPUT_LEN out, $NUM_PROMPTS prompts):"
    echo
    "$PYTHON" -m tokenmill.cli --log-level warning bench compare "$RESULTS_DIR"/*-c1.json --baseline tokenmill
} | tee "$RESULTS_DIR/summary.md"
