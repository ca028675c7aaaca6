#!/usr/bin/env bash
# Serve the same weights with tokenmill and with each peer in turn, run the same concurrency sweep
# against each, then print tables (and ratios tokenmill / peer) and draw one figure.
#
#   benchmarks/compare.sh                       # tokenmill, llama-server, vLLM CPU (fp32, bf16); levels 1,4,16,64
#   PEERS="llama-server" LEVELS=1,4,16 benchmarks/compare.sh
#   PEERS="" benchmarks/compare.sh              # tokenmill alone
#
# Everything it starts runs in its own process group and is stopped on exit, Ctrl-C or error.
# Results: $RESULTS_DIR (default benchmarks/results/<date>/): one JSON per server and level,
# compare.png, summary.md, each server's log, and contention.log (any other process that took more than
# 20% of a core while it ran: on a shared machine, the measure of how clean the run was).
# Knobs (environment):
#   PEERS              peers to run, among "llama-server vllm vllm-bf16" (default: all three; vllm is
#                      vLLM at fp32, vllm-bf16 at bf16, its own choice on CPUs with AMX)
#   SKIP_TOKENMILL=1   do not run tokenmill (e.g. to re-measure a peer alone)
#   LEVELS             concurrency levels (default 1,4,16,64)
#   INPUT_LEN / OUTPUT_LEN     random prompt / output tokens (default 200 / 64)
#   PROMPTS_PER_C / MIN_PROMPTS  each level sends max(MIN_PROMPTS, PROMPTS_PER_C * C) (default 2 / 8)
#   NUM_WARMUPS        untimed requests per server before the sweep (default 2)
#   MODEL              the .gguf file to serve (default: tokenmill's default model); vLLM gets its fp32 conversion
#   THREADS            CPU threads per server (default: number of cores)
#   PORT               port the servers take in turn (default 8321)
#   READY_TIMEOUT      seconds to wait for a server to answer /v1/models (default 900)
#   WAIT_QUIET         before each sweep, wait up to this many seconds for the machine to go idle
#                      (default 0: measure at once; contention.log tells whether anything interfered)
#   TOKENMILL_ARGS     extra flags for `tokenmill serve`
#   LLAMA_SERVER_ARGS  extra flags for llama-server (default none; --no-repack with an AMX build: peers/llama_server_defaults.sh)
#   NO_AMX             1 (the default on a CPU with AMX): llama-server built without ggml's AMX kernels
#   VLLM_ARGS          extra flags for `vllm serve`; VLLM_CPU_OMP_THREADS_BIND (default 0-(THREADS-1))
#   PYTHON             the tokenmill venv's python (default: .venv/bin/python, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source benchmarks/peers/vllm_serve.sh
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo "$ROOT/.venv/bin/python" || echo python3)}"
PEERS="${PEERS-llama-server vllm vllm-bf16}"
source benchmarks/peers/llama_server_defaults.sh  # NO_AMX, LLAMA_SERVER_ARGS
LEVELS="${LEVELS:-1,4,16,64}"
INPUT_LEN="${INPUT_LEN:-200}"
OUTPUT_LEN="${OUTPUT_LEN:-64}"
PROMPTS_PER_C="${PROMPTS_PER_C:-2}"
MIN_PROMPTS="${MIN_PROMPTS:-8}"
NUM_WARMUPS="${NUM_WARMUPS:-2}"
THREADS="${THREADS:-$(nproc)}"
PORT="${PORT:-8321}"
READY_TIMEOUT="${READY_TIMEOUT:-900}"
CACHE="${TOKENMILL_CACHE:-$HOME/.cache/tokenmill}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/benchmarks/results/$(date +%Y-%m-%d)}"
MODEL="${MODEL:-$("$PYTHON" -c 'from tokenmill.loader.model_source import default_model_path; print(default_model_path())')}"
MAXC="$(tr ',' '\n' <<<"$LEVELS" | sort -n | tail -1)"
CTX_PER_SLOT=512  # >= INPUT_LEN + OUTPUT_LEN with room for the chat template
(( INPUT_LEN + OUTPUT_LEN + 32 <= CTX_PER_SLOT )) || CTX_PER_SLOT=$(( INPUT_LEN + OUTPUT_LEN + 64 ))
MAX_MODEL_LEN=$(( CTX_PER_SLOT > 2048 ? CTX_PER_SLOT : 2048 ))
BASE_URL="http://127.0.0.1:$PORT"
mkdir -p "$RESULTS_DIR"
# the summary and the figure need the bench extras: check before measuring, not after 25 minutes
"$PYTHON" -c "import httpx, matplotlib" 2>/dev/null || {
    echo "compare.sh needs tokenmill's bench extras: $PYTHON -m pip install -e '.[bench]' (make compare does)" >&2
    exit 2
}

log() { printf '\n[compare %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- process bookkeeping: every server runs in its own session/process group --------------------------
SERVER_PID=""
stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
# --- contention monitor: the machine may be shared; log every other process that takes >20% of a core --
MONITOR_PID=""
monitor() {
    local me pid cpu cmd pg
    me="$(ps -o pgid= $$ | tr -d ' ')"
    while true; do
        top -b -n 2 -d 4 -w 200 2>/dev/null | awk '/^top -/ {n++} n == 2 && $1 ~ /^[0-9]+$/ && $9 + 0 > 20 {print $1, $9, $12}' |
        while read -r pid cpu cmd; do
            pg="$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')"
            [[ -z "$pg" || "$pg" == "$me" || "$pg" == "$(cat "$RESULTS_DIR/.server_pgid" 2>/dev/null)" ]] && continue
            echo "$(date +%H:%M:%S) pid $pid ${cpu}% $cmd $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-120)"
        done
    done >>"$RESULTS_DIR/contention.log"
}

cleanup() {
    [[ -z "${CLIENT_PID:-}" ]] || kill -TERM "$CLIENT_PID" 2>/dev/null || true
    stop_server
    [[ -z "$MONITOR_PID" ]] || kill -TERM "$MONITOR_PID" 2>/dev/null || true
    rm -f "$RESULTS_DIR/.server_pgid"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

start_server() {  # start_server NAME CMD...: run CMD in a new process group, log to RESULTS_DIR/NAME.log
    local name="$1"; shift
    log "starting $name: $*"
    setsid "$@" >"$RESULTS_DIR/$name.log" 2>&1 &
    SERVER_PID=$!
    echo "$SERVER_PID" >"$RESULTS_DIR/.server_pgid"
    local t0=$SECONDS
    until curl -sf "$BASE_URL/v1/models" >/dev/null 2>&1; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "$name exited during start-up; last lines of $RESULTS_DIR/$name.log:"; tail -20 "$RESULTS_DIR/$name.log" >&2
            SERVER_PID=""; return 1
        fi
        if (( SECONDS - t0 > READY_TIMEOUT )); then
            log "$name did not answer within ${READY_TIMEOUT}s"; stop_server; return 1
        fi
        sleep 2
    done
    log "$name ready after $(( SECONDS - t0 ))s"
}

cpu_busy_pct() {  # percent of all cores busy over the next 5 s (from /proc/stat)
    local a b
    a=($(head -1 /proc/stat)); sleep 5; b=($(head -1 /proc/stat))
    local idle=$(( b[4] + b[5] - a[4] - a[5] )) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
    echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}

wait_quiet() {  # shared machine: wait up to WAIT_QUIET s until the (idle) server's machine is <20% busy
    local deadline=$(( SECONDS + ${WAIT_QUIET:-0} )) busy=0
    while (( SECONDS < deadline )); do
        busy=$(cpu_busy_pct)
        (( busy < 20 )) && return 0
    done
    (( ${WAIT_QUIET:-0} == 0 )) || log "the machine is still ${busy}% busy; measuring anyway (see contention.log)"
}

CLIENT_PID=""
sweep() {  # sweep LABEL: the same load against whatever listens on PORT
    wait_quiet
    # in the background + wait, so a TERM to this script runs the trap at once (bash defers traps
    # until a foreground child exits)
    "$PYTHON" -m tokenmill.cli --log-level warning bench serve --base-url "$BASE_URL" --label "$1" \
        --dataset random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
        --sweep "$LEVELS" --prompts-per-concurrency "$PROMPTS_PER_C" --min-prompts "$MIN_PROMPTS" \
        --num-warmups "$NUM_WARMUPS" --seed 0 --tokenizer "$MODEL" --result-dir "$RESULTS_DIR" &
    CLIENT_PID=$!
    local rc=0
    wait "$CLIENT_PID" || rc=$?
    CLIENT_PID=""
    return "$rc"
}

run_one() {  # run_one LABEL CMD...: start, sweep, stop; a failing server does not stop the others
    local label="$1"; shift
    if start_server "$label" "$@"; then
        sweep "$label" || log "$label: some requests failed (see the JSON 'errors')"
        stop_server
    else
        FAILED+=("$label")
    fi
}

FAILED=()
: >"$RESULTS_DIR/contention.log"
monitor &
MONITOR_PID=$!
log "model $MODEL; levels $LEVELS; ${INPUT_LEN} in / ${OUTPUT_LEN} out; $THREADS threads; results in $RESULTS_DIR"

if [[ -z "${SKIP_TOKENMILL:-}" ]]; then
    # shellcheck disable=SC2086
    run_one tokenmill "$PYTHON" -m tokenmill.cli serve "$MODEL" --host 127.0.0.1 --port "$PORT" \
        --max-num-seqs "$MAXC" --max-model-len "$MAX_MODEL_LEN" --num-threads "$THREADS" ${TOKENMILL_ARGS:-}
fi

for peer in $PEERS; do
    case "$peer" in
    llama-server)
        BIN="$(benchmarks/peers/build_llama_server.sh | tail -1)"
        log "llama-server binary: $BIN"
        # One slot per concurrent request, each with the same context; unique prompts, so its prompt
        # cache cannot help (nor can tokenmill's prefix cache). LLAMA_SERVER_ARGS: see above.
        # shellcheck disable=SC2086
        run_one llama-server "$BIN" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --parallel "$MAXC" \
            --ctx-size $(( MAXC * CTX_PER_SLOT )) --threads "$THREADS" --threads-batch "$THREADS" \
            --alias "$(basename "$MODEL" .gguf)" $LLAMA_SERVER_ARGS
        ;;
    vllm|vllm-bf16)
        # vllm: fp32, as issue 5 set the peer up; vllm-bf16: bf16, what vLLM itself picks on a CPU with
        # AMX (and what tokenmill's --dtype auto picks there), so each is compared at its own best
        VDTYPE=float32; [[ "$peer" == vllm-bf16 ]] && VDTYPE=bfloat16
        # shellcheck disable=SC2086
        vllm_serve_cmd "$PYTHON" "$MODEL" "$CACHE" "$PORT" "$VDTYPE" "$MAX_MODEL_LEN" "$MAXC" ${VLLM_ARGS:-}
        run_one "$peer" "${VLLM_CMD[@]}"
        ;;
    *) log "unknown peer '$peer' (known: llama-server vllm vllm-bf16)"; FAILED+=("$peer") ;;
    esac
done

log "results"
shopt -s nullglob
JSONS=("$RESULTS_DIR"/*-random-completions-c*.json)
if (( ${#JSONS[@]} )); then
    {
        echo "# Serving comparison, $(date +%Y-%m-%d)"
        echo
        echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores.${TOKENMILL_NATIVE_ISA:+" Built for: TOKENMILL_NATIVE_ISA=$TOKENMILL_NATIVE_ISA (every server's kernels; torch's ATen and oneDNN held to it)."}"
        echo "Model: $(basename "$MODEL"); random prompts ${INPUT_LEN} in / ${OUTPUT_LEN} out, unique first tokens," \
             "greedy, ignore_eos; max(${MIN_PROMPTS}, ${PROMPTS_PER_C}*C) prompts per level; $THREADS threads."
        echo "Command: ${TOKENMILL_NATIVE_ISA:+TOKENMILL_NATIVE_ISA=$TOKENMILL_NATIVE_ISA }${TOKENMILL_ARGS:+TOKENMILL_ARGS=\"$TOKENMILL_ARGS\" }PEERS=\"$PEERS\" LEVELS=$LEVELS INPUT_LEN=$INPUT_LEN OUTPUT_LEN=$OUTPUT_LEN" \
             "PROMPTS_PER_C=$PROMPTS_PER_C${SKIP_TOKENMILL:+ SKIP_TOKENMILL=1}${WAIT_QUIET:+ WAIT_QUIET=$WAIT_QUIET}" \
             "benchmarks/compare.sh (summary of every JSON in this directory)"
        echo
        "$PYTHON" -m tokenmill.cli --log-level warning bench compare "${JSONS[@]}" --baseline tokenmill
        if [[ -s "$RESULTS_DIR/contention.log" ]]; then
            echo
            echo "Contention: other processes took >20% of a core at $(wc -l <"$RESULTS_DIR/contention.log")" \
                 "samples (4 s each) during this run: compare contention.log with each JSON's date and duration."
        fi
    } | tee "$RESULTS_DIR/summary.md"
    "$PYTHON" -m tokenmill.cli --log-level warning bench plot "${JSONS[@]}" -o "$RESULTS_DIR/compare.png"
fi
if (( ${#FAILED[@]} )); then
    log "could not run: ${FAILED[*]} (logs in $RESULTS_DIR)"
    exit 1
fi
